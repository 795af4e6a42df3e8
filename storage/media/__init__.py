"""Media by object key (docs/media.md): the database holds only the key
(`media/{uid}/{sha256}`), never a URL; URLs are signed on demand with an expiry.

- the key format and the media content a message carries are protocol/mediakeys.py
  (pure: the client uses them too);
- signing.py: the HMAC-signed URLs of a `file://` media root (pure);
- index_sqlite.py: the uploads and references, in the store's database (`MediaIndex`, SQLite);
- index_mysql.py: the same on MySQL (the metadata database);
- objects.py: the objects themselves, `file://` or `s3://`, and their signed URLs;
- sweep.py: the delayed cleanup of uploads no message references.
"""
