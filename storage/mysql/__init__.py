"""The MySQL/MariaDB adapter: the authoritative store of the production deployment."""

from storage.mysql.store import MySQLSettings, MySQLStore, migrate

__all__ = ["MySQLSettings", "MySQLStore", "migrate"]
