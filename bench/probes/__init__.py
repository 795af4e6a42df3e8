"""Probes: small measurements of one part of the product (a codec, a driver, a
connection layer, the socket floor, pruning and the archive), each run with
`python -m bench.probes.<name>`; docs/performance.md and docs/decisions.md cite them."""
