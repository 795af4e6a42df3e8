"""The cold tier: messages moved out of the hot store into Parquet files on object storage.

- objects.py: archive URLs (`file:///path`, `s3://bucket/prefix?endpoint=...`) and the
  Parquet files themselves (pyarrow);
- index_sqlite.py, index_mysql.py: the archive index in the store's own database (per
  conversation: archived seq range -> file), on SQLite and on MySQL, and the commit
  that moves a batch;
- run.py: `imgw archive run`, the mover;
- tiered.py: HISTORY and PULL pages that reach below the oldest hot seq.
"""
