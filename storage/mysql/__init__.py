"""The MySQL/MariaDB adapter: the authoritative store of the production deployment."""

from storage.mysql.schema import migrate
from storage.mysql.settings import MySQLSettings
from storage.mysql.store import MySQLStore

__all__ = ["MySQLSettings", "MySQLStore", "migrate"]
