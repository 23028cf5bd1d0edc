"""A bounded, thread-safe LRU: the device's cache of built kernels and its cache of
constant tables (kept apart from programs and device so neither imports the other)."""

import collections
import threading

CACHE_SIZE = 256    # built programs kept per device


class KernelCache:
    """Bounded LRU of built programs and their kernels for one device."""

    def __init__(self, maxsize=CACHE_SIZE):
        self.maxsize = maxsize
        self._items = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self):
        return len(self._items)

    def clear(self):
        with self._lock:
            self._items.clear()

    def get(self, key):
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return item

    def put(self, key, item):
        with self._lock:
            self.misses += 1
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
