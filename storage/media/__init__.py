"""Media by object key (docs/media.md): the database holds only the key
(`media/{uid}/{sha256}`), never a URL; URLs are signed on demand with an expiry.

- keys.py: the key format and the media content a message carries (pure);
- signing.py: the HMAC-signed URLs of a `file://` media root (pure);
- index.py: the uploads and references, in the store's database (`MediaIndex`, SQLite);
- mysqlindex.py: the same on MySQL (the metadata database);
- objects.py: the objects themselves, `file://` or `s3://`, and their signed URLs;
- sweep.py: the delayed cleanup of uploads no message references.
"""
