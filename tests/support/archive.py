"""Looking at an archive location the way the archiver does not need to."""

from __future__ import annotations

import pyarrow.fs as pafs

from storage.archive.objects import Location


def file_exists(loc: Location, key: str) -> bool:
    """Whether `key` is a file under the archive location `loc`."""
    return bool(loc.fs.get_file_info(loc.path(key)).type == pafs.FileType.File)
