"""The Redis adapters (redis-py asyncio, hiredis when installed): the shared route store
(`RedisRouteStore`) and the accelerator of the production store (`RedisCache`). Key
layouts are in the docstrings of `routes` and `cache`."""

from storage.models import SentRecord, content_digest
from storage.redis.cache import MemberSnapshot, RedisCache
from storage.redis.connect import redis_from_url
from storage.redis.routes import RedisRouteStore

__all__ = [
    "MemberSnapshot",
    "RedisCache",
    "RedisRouteStore",
    "SentRecord",
    "content_digest",
    "redis_from_url",
]
