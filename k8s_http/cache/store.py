"""Store: the informer cache. A dict of objects by key, plus secondary indexes.

One lock guards everything, so a reader never sees an object without its
index entries or an index entry without its object. Writes are rare compared
with reads and cheap (a dict assignment and a few set operations), so one lock
is simpler than finer-grained schemes and not slower in practice.

The Store takes objects (one by one, or a list's raw items through a
`StoreList`) and gives back dicts; how it keeps them is its own business.
It keeps them packed (k8s_http.cache.packed): one flat tuple of leaves per object,
its structure shared with every object of the same shape. That is several
times smaller than dicts and lists, and the garbage collector never walks it.
Every read builds a new dict, so readers may edit what they get; the price is
a few microseconds per read. The Store owns the objects it is given: the
transform may modify them in place.

Read-your-writes: after a controller writes an object, the watch brings the
change a moment later, and a reconcile in between would act on the old copy
(write again, or create-only a child it has just made and be refused).
`begin_write` / `end_write` keep the server's answer until the store
*observes* the key again, and `get` returns it meanwhile. Only the store knows exactly when it
observes a key, which is why this lives here and not in a controller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

from ..core.objects import ObjectKey, controller_of, key_of, strip_managed_fields
from ..core.objects import resource_version_of as _rv
from .packed import LEAF, leaf, pack, same_apart_from, seal
from .projection import Projection

__all__ = ["Store", "Change", "StoreList", "Fields", "Indexer", "DEFAULT_INDEXERS",
           "index_namespace", "index_owner_uid"]

_NAME = ("metadata", "name")
_NAMESPACE = ("metadata", "namespace")
_RESOURCE_VERSION = ("metadata", "resourceVersion")
_KEY_PATHS = (_NAMESPACE, _NAME)
# ObjectKey(ns, name) runs the named tuple's Python-level __new__; this is the
# same tuple made in C (a start-up makes at least one per cached object).
_new_key = tuple.__new__

# Fields of an object, each a path of keys: (("metadata", "name"), ("spec",)).
Fields = tuple[tuple[str, ...], ...]

# An indexer maps an object to the index values it is filed under (often one, maybe none).
# It must be a pure function of the object: the Store recomputes it to un-file an
# old object instead of remembering what it returned.
Indexer = Callable[[dict], Iterable[str]]


def index_namespace(obj: dict) -> list[str]:
    return [key_of(obj).namespace]


def index_owner_uid(obj: dict) -> list[str]:
    """The uid of the controlling ownerReference, if any."""
    ref = controller_of(obj)
    uid = ref.get("uid") if ref else None
    return [uid] if isinstance(uid, str) and uid else []


# As client-go's: only the namespace index unless asked. An index costs memory
# per object (a set entry, a set per value) whether or not anyone reads it;
# pass {"owner_uid": index_owner_uid} to have that one.
DEFAULT_INDEXERS: Mapping[str, Indexer] = {
    "namespace": index_namespace,
}


class Change(NamedTuple):
    """What a watch event changed in a Store (`upsert_if_changed`)."""
    old: dict | None          # the object it replaced (None: it added one)
    new: dict                 # the object now stored (both: some fields alone if asked `fields`)
    echo_of: object           # the writer of the write this event brings back, or None


class _ByNamespace:
    """The objects of a Store: namespace -> name -> stored form.

    Keyed by the two strings an ObjectKey holds rather than by ObjectKeys: the
    strings are the objects' own (interned by a projection), so a cached object
    costs no key object at all (48 bytes each, three per My), a lookup hashes
    two cached str hashes instead of a key's fields, and a namespace's objects
    are one dict. Invariant: no namespace maps to an empty dict; `_count` is the
    number of objects. Not thread-safe: the Store's lock guards it.
    """

    __slots__ = ("_spaces", "_count")

    def __init__(self):
        self._spaces: dict[str, dict[str, object]] = {}
        self._count = 0

    def get(self, key: ObjectKey) -> object | None:
        names = self._spaces.get(key.namespace)
        return None if names is None else names.get(key.name)

    def put(self, key: ObjectKey, stored: object) -> object | None:
        """Store `stored` under `key`; returns what it replaced, if anything."""
        names = self._spaces.get(key.namespace)
        if names is None:
            names = self._spaces[key.namespace] = {}
        old = names.get(key.name)
        names[key.name] = stored
        if old is None:
            self._count += 1
        return old

    def pop(self, key: ObjectKey) -> object | None:
        names = self._spaces.get(key.namespace)
        old = None if names is None else names.pop(key.name, None)
        if old is not None:
            self._count -= 1
            if not names:
                del self._spaces[key.namespace]
        return old

    def in_namespace(self, namespace: str) -> list[object]:
        return list(self._spaces.get(namespace, {}).values())

    def keys_in(self, namespace: str | None) -> list[ObjectKey]:
        """The keys of one namespace, or of all of them (None)."""
        spaces = self._spaces.items() if namespace is None else \
            [(namespace, self._spaces.get(namespace, {}))]
        return [_new_key(ObjectKey, (ns, name)) for ns, names in spaces for name in names]

    def values(self) -> list[object]:
        return [stored for names in self._spaces.values() for stored in names.values()]

    def items(self, namespace: str | None = None) -> list[tuple[ObjectKey, object]]:
        """(key, stored form) of one namespace, or of all of them (None)."""
        spaces = self._spaces.items() if namespace is None else \
            [(namespace, self._spaces.get(namespace, {}))]
        return [(_new_key(ObjectKey, (ns, name)), stored)
                for ns, names in spaces for name, stored in names.items()]

    def __contains__(self, key: ObjectKey) -> bool:
        return self.get(key) is not None

    def present(self, keys: Iterable[ObjectKey]) -> list[ObjectKey]:
        """Those of `keys` held (in one call: a list's keys, tens of thousands)."""
        spaces = self._spaces
        return [key for key in keys if key.name in spaces.get(key.namespace, ())]

    def __len__(self) -> int:
        return self._count


def nothing_cached(obj: dict) -> bool:
    """Store.replace(within=nothing_cached): no cached object is in scope, the
    list only adds (known without looking at any)."""
    return False


class StoreList:
    """A list's objects on their way into one Store (`Store.new_list`), each kept
    in the store's form as it is appended: a list of 100,000 objects is never
    held as dicts. What is not an object (a malformed item) is left out: nothing
    a reader could look up by key. `Store.replace` takes it whole; `objects`
    builds what it holds one at a time, for whoever is told of the list."""

    __slots__ = ("_store", "_stored")

    def __init__(self, store: Store, objects: Iterable = ()):
        self._store = store
        self._stored: list[tuple] = []
        for obj in objects:
            self.append(obj)

    def append(self, obj: object) -> None:
        if isinstance(obj, dict):
            self._stored.append(self._store._prepare(obj))

    def __len__(self) -> int:
        return len(self._stored)

    def __iter__(self) -> Iterator[dict]:
        return self.objects()

    def objects(self, *, fields: Fields | None = None) -> Iterator[dict]:
        """What was appended, built one at a time (`fields`: see Store.upsert_if_changed)."""
        part = self._store._part
        for stored in self._stored:
            yield part(stored, fields)

    def split(self, test: Callable[[dict], bool], *, fields: Fields | None = None
              ) -> tuple[StoreList, StoreList]:
        """(the objects `test` is true of, the others), each in the order appended;
        each object is built (with `fields` alone: see `objects`) to be tested."""
        yes, no = StoreList(self._store), StoreList(self._store)
        part = self._store._part
        for stored in self._stored:
            (yes if test(part(stored, fields)) else no)._stored.append(stored)
        return yes, no


class Store:
    """Thread-safe object cache keyed by ObjectKey, with indexes kept on every write.

    `transform(obj) -> obj` runs on every object on the way in (default: drop
    managedFields, which are often half an object's size); a Projection is
    applied and packed in one walk. `indexers` are added to the default
    ("namespace"); passing a default name replaces it.
    """

    def __init__(self, *, transform: Callable[[dict], dict] | None = strip_managed_fields,
                 indexers: Mapping[str, Indexer] | None = None):
        self.transform = transform      # as given: the Manager compares it
        # The stored form never holds metadata.managedFields, so a watch
        # filling this store need not even decode them.
        self.drops_managed_fields = (
            transform is strip_managed_fields
            or (isinstance(transform, Projection)
                and not transform.keeps(("metadata", "managedFields"))))
        self._transform = transform or (lambda obj: obj)
        self._pack = (transform.pack if isinstance(transform, Projection)
                      else lambda obj: pack(self._transform(obj)))
        every = {**DEFAULT_INDEXERS, **(indexers or {})}
        # The namespace index is answered from the keys (each key holds its
        # namespace): a scan per query, which only a relist by namespace makes,
        # instead of a set entry per object. Other indexes are filed.
        self._scanned = frozenset(n for n, ix in every.items() if ix is index_namespace)
        self._indexers: dict[str, Indexer] = {n: ix for n, ix in every.items()
                                              if n not in self._scanned}
        self._lock = threading.Lock()
        # Invariants (under _lock): key in _indices[name][value] iff key in _objects
        # and value in _indexers[name](the object stored under key). Empty value
        # sets are removed.
        self._objects = _ByNamespace()                 # key -> stored form (_prepare)
        self._indices: dict[str, dict[str, set[ObjectKey]]] = {n: {} for n in self._indexers}
        # Our own writes the watch has not brought yet: key -> (stale, written,
        # writer), the writer as end_write was given it (or None).
        # Invariant: key in _written => since `written` was recorded, the store
        # has observed the key only with resourceVersions in `stale` (versions
        # known to be older than `written`). Any other observation, a delete or a
        # relist drops the entry: from then on the watch speaks for the key.
        self._written: dict[ObjectKey, tuple[frozenset, object, object]] = {}
        # Writes in flight and what was observed meanwhile: a counter of
        # observations, the tokens (counter values when each write began, with
        # multiplicity), and the last observation of each key made while a write
        # was in flight, kept only as long as an older write is still in flight.
        self._seq = 0
        self._relisted_at = 0
        self._inflight: dict[int, int] = {}
        self._recent: dict[ObjectKey, int] = {}

    def new_list(self, objects: Iterable = ()) -> StoreList:
        """An empty StoreList for this store (or one holding `objects`): a list's
        items go in one by one as they arrive, then `replace` takes it."""
        return StoreList(self, objects)

    # ---- the stored form ----------------------------------------------------

    def _prepare(self, obj: dict) -> tuple:
        """The stored form of `obj`: transformed and packed."""
        try:
            return self._pack(obj)
        except RecursionError:
            # Nested deeper than the walks can go (JSON decodes deeper than that):
            # kept whole as one leaf, shared with readers.
            try:
                obj = self._transform(obj)
            except RecursionError:
                pass
            return seal([LEAF], [obj])

    @staticmethod
    def _restore(stored: tuple) -> dict:
        return stored[0].build(stored)

    @staticmethod
    def _stored_key(stored: tuple) -> ObjectKey:
        namespace, name = stored[0].leaves_getter(_KEY_PATHS)(stored)
        return _new_key(ObjectKey, (namespace or "", name or ""))

    @staticmethod
    def _stored_rv(stored: tuple | None) -> str | None:
        if stored is None:
            return None
        rv = leaf(stored, _RESOURCE_VERSION)
        return rv if isinstance(rv, str) else None

    # ---- reads ------------------------------------------------------------

    def get(self, key: ObjectKey) -> dict | None:
        """The object, or our own newer write of it that the watch has not brought yet."""
        with self._lock:
            stored = self._visible_locked(key)
        return None if stored is None else self._restore(stored)

    def resource_version(self, key: ObjectKey) -> str | None:
        """What `get(key)` would answer's metadata.resourceVersion, without building it."""
        with self._lock:
            return self._stored_rv(self._visible_locked(key))

    def list(self) -> list[dict]:
        with self._lock:
            stored = self._objects.values()
        return [self._restore(s) for s in stored]

    def keys(self) -> list[ObjectKey]:
        with self._lock:
            return self._objects.keys_in(None)

    def leaves(self, path: tuple[str, ...]) -> list[object]:
        """The leaf at `path` of every cached object (None where it has none),
        without building a single object: for counts over a whole cache."""
        with self._lock:
            stored = self._objects.values()
        return [leaf(s, path) for s in stored]

    @property
    def version(self) -> int:
        """A number that changes whenever an object is added, replaced or removed:
        what was computed over the whole cache at one version holds until it moves."""
        return self._seq

    def by_index(self, index: str, value: str) -> list[dict]:
        """Objects filed under `value` in `index`; KeyError for an unknown index."""
        with self._lock:
            if index in self._scanned:
                stored = self._objects.in_namespace(value)
            else:
                stored = [self._objects.get(k) for k in self._indices[index].get(value, ())]
        return [self._restore(s) for s in stored]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._objects

    # ---- writes -----------------------------------------------------------

    def begin_write(self) -> int:
        """Call before sending a write; pass the token to `end_write` whatever happens."""
        with self._lock:
            token = self._seq
            self._inflight[token] = self._inflight.get(token, 0) + 1
            return token

    def end_write(self, token: int, written: dict | None = None, *,
                  base: dict | None = None, writer: object = None) -> None:
        """Remember `written`, the server's answer to our write, until the watch brings it.

        `written` None: the write failed, nothing to remember. `base`: the object
        the write was computed from (what `get` returned, or a live read); its
        resourceVersion is known to be older than `written`'s. Writing on top of
        an earlier unobserved write keeps that write's stale versions too.
        `writer`: who wrote, as a handler would name it (a Runner's
        `current_work()`: its queue and key); `upsert_if_changed` hands it back
        with the watch's copy of this write, which that writer has already seen.
        A copy that the watch brings before this call is not named (it made the
        write unremembered, below): under load, a good part of them.

        Not remembered if the store observed the key while the write was in
        flight: the watch may already have brought this write *and later
        changes*, and resourceVersions cannot be ordered (they are opaque), so
        the answer could be older than the cache. Then the cache is the truth.
        """
        key = stored = None
        if written is not None:
            key, written_rv = key_of(written), _rv(written)
            stored = self._prepare(written)
        base_rv = _rv(base)
        with self._lock:
            left = self._inflight.pop(token) - 1
            if left:
                self._inflight[token] = left
            if key is not None and self._recent.get(key, -1) <= token \
                    and self._relisted_at <= token:
                stale = {base_rv} if base_rv is not None else set()
                previous = self._written.get(key)
                if previous is not None and base_rv == self._stored_rv(previous[1]):
                    stale |= previous[0]
                stale.discard(written_rv)
                self._written[key] = (frozenset(stale), stored, writer)
            # Observations older than every write still in flight can no longer matter.
            if not self._inflight:
                self._recent.clear()
            else:
                oldest = min(self._inflight)
                for k in [k for k, seq in self._recent.items() if seq <= oldest]:
                    del self._recent[k]

    def _observe_locked(self, key: ObjectKey, rv: str | None) -> None:
        self._seq += 1
        if self._inflight:
            self._recent[key] = self._seq
        entry = self._written.get(key)
        if entry is not None and (rv is None or rv not in entry[0]):
            del self._written[key]

    def upsert(self, obj: dict) -> tuple[dict | None, dict]:
        """Add or replace `obj` (transformed); returns (the object it replaced or None,
        the object stored), so a caller needs no second read to see what it stored.
        Both are the caller's own copies."""
        change = self._upsert(obj, quiet=False)
        return change.old, change.new

    def upsert_if_changed(self, obj: dict, *, fields: Fields | None = None) -> Change | None:
        """`upsert` for a watch event: None when the object stored is the one it
        replaces apart from metadata.resourceVersion (a change only in fields the
        transform drops, such as the Deployment controller's revision annotation):
        whoever was told of that one has nothing new to learn, and nothing is built.
        Otherwise the Change, whose `echo_of` is the writer of our unobserved write
        when this is the watch's copy of it (same resourceVersion, see end_write).
        `fields`: the Change's objects are built with those fields alone (paths of
        keys: `(("metadata", "name"),)` builds `{"metadata": {"name": ...}}`; a
        field the object lacks is left out), for a reader that needs nothing else
        (an informer's key mappers, see informer.KeyMapper)."""
        return self._upsert(obj, quiet=True, fields=fields)

    def _upsert(self, obj: dict, *, quiet: bool, fields: Fields | None = None) -> Change | None:
        key, rv = key_of(obj), _rv(obj)
        # The watch's copy of our own write (the resourceVersion of the answer
        # end_write kept) is that answer: stored already, it is not projected
        # again. (A lock-free peek: whatever _written holds by the time the lock
        # is taken, the object at that resourceVersion is the same.)
        written = self._written.get(key)
        if written is not None and rv is not None and rv == self._stored_rv(written[1]):
            stored = written[1]
        else:
            stored = self._prepare(obj)
        # The stored object's own name and namespace (a projection interned
        # them) are what the store files it under: the decoded event's
        # strings would otherwise stay alive as its dict keys. Unless the
        # transform dropped or changed them.
        own = self._stored_key(stored)
        if own == key:
            key = own
        # Built before the lock only for the indexes, which read the object (and
        # may raise, before anything has changed); otherwise after, if at all.
        new = self._restore(stored) if self._indexers else None
        values = self._index_values(new) if new is not None else {}
        with self._lock:
            written = self._written.get(key)
            echo_of = written[2] if written is not None and rv is not None and \
                rv == self._stored_rv(written[1]) else None
            old = self._objects.put(key, stored)
            if old is not None:
                self._unfile_locked(key, old)
            self._file_locked(key, values)
            self._observe_locked(key, rv)
        if quiet and old is not None and same_apart_from(old, stored, _RESOURCE_VERSION):
            return None
        if new is None or fields is not None:
            new = self._part(stored, fields)
        return Change(None if old is None else self._part(old, fields), new, echo_of)

    def _part(self, stored: tuple, fields: Fields | None) -> dict:
        """The stored form built whole, or with `fields` alone (see upsert_if_changed)."""
        if fields is None or stored[0].shape is None:
            return self._restore(stored)        # (shape None: an object kept whole, see _prepare)
        return stored[0].fields_builder(fields)(stored)

    def _visible_locked(self, key: ObjectKey) -> object | None:
        """The stored form `get(key)` answers from: our unobserved write, or the cache's."""
        written = self._written.get(key)
        return written[1] if written is not None else self._objects.get(key)

    def delete(self, obj_or_key: dict | ObjectKey) -> dict | None:
        """Remove by key (or by the key of an object); returns the removed object, if any."""
        key = obj_or_key if isinstance(obj_or_key, ObjectKey) else key_of(obj_or_key)
        with self._lock:
            old = self._remove_locked(key)
        return None if old is None else self._restore(old)

    def _remove_locked(self, key: ObjectKey) -> object | None:
        """Drop `key` (its indexes too, and our write's read-your-writes entry);
        returns its stored form, if it was cached."""
        old = self._objects.pop(key)
        if old is not None:
            self._unfile_locked(key, old)
        self._observe_locked(key, None)
        return old

    def _keys_where(self, test: Callable[[dict], bool],
                    namespace: str | None = None) -> list[ObjectKey]:
        """The keys of the cached objects (of `namespace`) `test` is true of,
        judged outside the lock: restoring thousands must not block readers."""
        with self._lock:
            candidates = self._objects.items(namespace)
        return [key for key, stored in candidates if test(self._restore(stored))]

    def remove_where(self, test: Callable[[dict], bool]) -> list[dict]:
        """Remove every object `test` is true of; returns them (as `replace`
        returns the vanished: for the caller to notify about). For a cache whose
        selection narrowed. The test runs outside the lock on the objects as
        cached; a caller that also writes must not write meanwhile (an informer
        holds its delivery lock)."""
        doomed = self._keys_where(test)
        with self._lock:
            removed = [old for key in doomed if (old := self._remove_locked(key)) is not None]
        return [self._restore(s) for s in removed]

    def replace(self, objects: Iterable | StoreList, *, namespace: str | None = None,
                within: Callable[[dict], bool] | None = None,
                unchanged: set[ObjectKey] | None = None) -> list[dict]:
        """Atomically make the store hold exactly `objects`; returns the objects that vanished.

        The vanished objects are deleted here, for good: they are returned only
        for the caller to notify about (an informer enqueues their keys), never
        to be deleted again.

        With `namespace`, only that namespace is replaced and the rest is kept:
        an informer with one watcher per namespace shares one store, and each
        watcher's relist speaks only for its own namespace.
        Readers see either the old contents or the new, never a mixture.
        `objects`: dicts, or a StoreList of this store's (an informer's watcher
        fills one as a list arrives, so a long list is never held as dicts).
        With `within`, only the cached objects it is true of are in scope (with
        `namespace`, those of that namespace): an informer watching several
        selections into one store replaces one selection's objects with its list.
        `unchanged`: given a set, the keys of the objects the store held at the
        same resourceVersion are added to it (an informer queues them low).
        """
        if not (isinstance(objects, StoreList) and objects._store is self):
            objects = self.new_list(objects)
        incoming: dict[ObjectKey, tuple] = {self._stored_key(stored): stored
                                            for stored in objects._stored}
        # Index the incoming objects before taking the lock: the slow part of a
        # 10,000-object relist must not block readers.
        filed = {key: self._index_values(self._restore(stored))
                 for key, stored in incoming.items()} if self._indexers else {}
        scope: list[ObjectKey] | None = None
        if within is nothing_cached:
            scope = []
        elif within is not None:
            scope = self._keys_where(within, namespace)
        with self._lock:
            # Replaced: everything in scope, plus any key the new list holds.
            objects = self._objects
            if unchanged is not None:
                rv = self._stored_rv
                unchanged.update(key for key, stored in incoming.items()
                                 if (old := objects.get(key)) is not None
                                 and rv(old) == rv(stored) is not None)
            if namespace is None and scope is None:
                vanished = [s for k, s in objects.items() if k not in incoming]
                self._objects = objects = _ByNamespace()
                self._indices = {name: {} for name in self._indexers}
            else:
                vanished = []
                stale = (objects.keys_in(namespace) if scope is None else scope) + \
                    objects.present(incoming)
                for key in stale:
                    old = objects.pop(key)
                    if old is None:
                        continue                # listed twice in stale
                    self._unfile_locked(key, old)
                    if key not in incoming:
                        vanished.append(old)
            for key, stored in incoming.items():
                objects.put(key, stored)
            for key, values in filed.items():
                self._file_locked(key, values)
            self._seq += 1
            self._relisted_at = self._seq      # a write in flight now may be older than the list
            in_scope = None if scope is None else set(scope).union(incoming)
            for key in [k for k in self._written if (namespace is None or k.namespace == namespace)
                        and (in_scope is None or k in in_scope)]:
                incoming_obj = incoming.get(key)
                self._observe_locked(key, self._stored_rv(incoming_obj) if incoming_obj else None)
        return [self._restore(s) for s in vanished]

    # ---- index bookkeeping ---------------------------------------------------

    def _index_values(self, obj: dict) -> dict[str, tuple[str, ...]]:
        return {name: tuple(indexer(obj)) for name, indexer in self._indexers.items()}

    def _file_locked(self, key: ObjectKey, values: Mapping[str, Iterable[str]]) -> None:
        for name, vals in values.items():
            index = self._indices[name]
            for value in vals:
                index.setdefault(value, set()).add(key)

    def _unfile_locked(self, key: ObjectKey, stored: object) -> None:
        if not self._indexers:
            return
        for name, vals in self._index_values(self._restore(stored)).items():
            index = self._indices[name]
            for value in vals:
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
