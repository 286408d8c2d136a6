"""What crosses the sandbox's boundary: values as JSON trees plus .npy blobs.

    tree, blobs = encode(value)                    # either side
    value = decode(tree, blobs, trusted=True)      # the grader reading the sandbox's results
    value = decode(tree, blobs, trusted=False)     # the sandbox reading the grader's inputs

A tree is JSON: every node a dict with a type tag "t". Arrays travel as .npy bytes, loaded with
``np.load(allow_pickle=False)``; only numeric and boolean dtypes (and ml_dtypes' 8/16-bit floats,
sent as their raw integer view) are accepted. In the trusted direction (``trusted=True``) nothing
is imported and nothing is unpickled: a namedtuple comes back as a tuple, an object as
``Unsupported(type name)``, and sizes, depths and item counts are bounded (a hostile kernel can
send any bytes). The grader's inputs may carry objects the sandbox rebuilds: dataclasses and
namedtuples (the real class when the sandbox's view of preln has it, a stand-in with the same
fields otherwise), random generators (their state), and, where the grader asks for it, a pickle
(objects such as a TransformerStack; the sandbox trusting the grader is the safe direction).

This file runs on both sides of the boundary (it is copied into the sandbox's library): numpy and
the standard library only.
"""
import base64
import collections
import dataclasses
import importlib
import io
import json
import pickle

import numpy as np

#: bounds on what the trusted side accepts from a sandbox
MAX_DEPTH = 24
MAX_ITEMS = 100_000            # containers' items, summed over a tree
MAX_STR = 100_000              # characters of one string
MAX_INT_DIGITS = 400
MAX_BLOB_BYTES = 64 * 2 ** 20  # one array
MAX_TOTAL_BYTES = 256 * 2 ** 20
#: one figure in a notebook's outputs: characters of its base64 PNG (about 1.5 MB of image), kept
#: whole up to here by the runner in the sandbox (never cut like text) and shown by the feedback
MAX_PNG = 2 * 2 ** 20

#: ml_dtypes' types travel as their raw bits: name -> integer dtype of the same size
ML_DTYPES = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8",
             "float8_e4m3fnuz": "uint8", "float8_e5m2fnuz": "uint8", "float8_e4m3b11fnuz": "uint8"}
NUMERIC_KINDS = "biufc"


class Unsupported:
    """A value the sandbox could not send as data (``type_name`` says what it was)."""

    def __init__(self, type_name):
        self.type_name = type_name

    def __repr__(self):
        return f"Unsupported({self.type_name})"


class WireError(ValueError):
    """The data are malformed or too large."""


# ---- encoding --------------------------------------------------------------------------------
class _Encoder:
    def __init__(self, allow_pickle, limit_bytes):
        self.blobs, self.items, self.total = {}, 0, 0
        self.allow_pickle, self.limit_bytes = allow_pickle, limit_bytes

    def blob(self, data):
        self.total += len(data)
        if self.limit_bytes and (len(data) > MAX_BLOB_BYTES or self.total > MAX_TOTAL_BYTES):
            raise WireError(f"too large to send: {len(data)} bytes in one array, {self.total} in all")
        name = f"b{len(self.blobs)}"
        self.blobs[name] = data
        return name

    def array(self, a):
        ml = _ml_name(a.dtype)
        if ml:
            a = a.view(ML_DTYPES[ml])
        elif a.dtype.kind not in NUMERIC_KINDS or a.dtype.names is not None:
            raise WireError(f"an array of dtype {a.dtype} is not numeric data")
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)    # keeps shape () (ascontiguousarray would not)
        node = {"blob": self.blob(buf.getvalue())}
        if ml:
            node["ml"] = ml
        return node

    def enc(self, v, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("nested too deeply")
        self.items += 1
        if self.limit_bytes and self.items > MAX_ITEMS:
            raise WireError("too many items")
        if v is None or isinstance(v, bool):
            return {"t": "const", "v": v}
        t = type(v)
        if t is int:
            return {"t": "int", "v": str(v)}
        if t is float:
            return {"t": "float", "v": v.hex()}
        if t is complex:
            return {"t": "complex", "v": [v.real.hex(), v.imag.hex()]}
        if t is str:
            if self.limit_bytes and len(v) > MAX_STR:
                raise WireError("a string too long")
            return {"t": "str", "v": v}
        if t is np.ndarray:
            return {"t": "array", **self.array(v)}
        if isinstance(v, np.ndarray) and not self.allow_pickle:
            # a subclass (np.matrix, a MaskedArray with nothing masked) is sent as its data, a plain
            # array; a MaskedArray with masked values is not data (what would they be compared as?)
            if isinstance(v, np.ma.MaskedArray):
                if np.ma.is_masked(v):
                    raise WireError("not data: a MaskedArray with masked values")
                return {"t": "array", **self.array(np.asarray(v.data).view(np.ndarray))}
            return {"t": "array", **self.array(v.view(np.ndarray))}
        if isinstance(v, np.generic) and t.__module__ in ("numpy", "ml_dtypes") and not isinstance(v, np.void):
            return {"t": "npscalar", **self.array(np.asarray(v))}
        if isinstance(v, np.generic) and _ml_name(np.asarray(v).dtype):
            return {"t": "npscalar", **self.array(np.asarray(v))}
        if t is np.dtype or isinstance(v, np.dtype):
            return {"t": "dtype", "v": _dtype_name(v)}
        if isinstance(v, type) and issubclass(v, np.generic):
            return {"t": "dtype_type", "v": _dtype_name(np.dtype(v))}
        if t is np.random.Generator:
            state = v.bit_generator.state
            return {"t": "generator", "v": self.enc(state, depth + 1)}
        if t is tuple:
            return {"t": "tuple", "v": [self.enc(x, depth + 1) for x in v]}
        if t is list:
            return {"t": "list", "v": [self.enc(x, depth + 1) for x in v]}
        if t is dict:
            return {"t": "dict", "k": [self.enc(k, depth + 1) for k in v],
                    "v": [self.enc(x, depth + 1) for x in v.values()]}
        if isinstance(v, tuple) and hasattr(t, "_fields"):                  # a namedtuple
            return {"t": "namedtuple", "cls": _qualname(t), "fields": list(t._fields),
                    "v": [self.enc(x, depth + 1) for x in v]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {"t": "dataclass", "cls": _qualname(t),
                    "fields": {f.name: self.enc(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v)}}
        if isinstance(v, Unsupported):
            return {"t": "unsupported", "v": v.type_name}
        source = getattr(v, "_preln_source", None)
        if callable(v) and isinstance(source, tuple):         # preln.course.code(...): sent as text
            text, env = source
            return {"t": "source", "v": text, "env": self.enc(env, depth + 1)}
        if self.allow_pickle:                                 # the grader's objects (a stack, a block)
            obj = v.obj if isinstance(v, Pickled) else v
            try:
                data = pickle.dumps(obj, protocol=4)
            except Exception as e:                            # noqa: BLE001: a lambda, say
                raise WireError(f"a {_qualname(t)} cannot be sent to the sandbox ({e}); pass data, "
                                "or a function written as preln.course.code('lambda ...')") from None
            return {"t": "pickle", "blob": self.blob(data), "type": _qualname(type(obj))}
        raise WireError(f"a {_qualname(t)} is not data")


class Pickled:
    """Wrap an object the grader sends into the sandbox as a pickle (its class must be in the
    sandbox's view of preln)."""

    def __init__(self, obj):
        self.obj = obj


def encode(value, allow_pickle=False, limit=True):
    """(tree, blobs) for ``value``. Raises WireError for what is not data (an object, a subclass of
    ndarray, an object array) or exceeds the bounds (with ``limit``)."""
    e = _Encoder(allow_pickle, limit)
    tree = e.enc(value)
    return tree, e.blobs


def encode_result(value):
    """The tree of a student's return value: like :func:`encode`, but an unsupported value (or
    part of one) becomes an ``unsupported`` node naming its type instead of an error."""
    e = _Encoder(False, True)
    try:
        return e.enc(value), e.blobs
    except WireError as err:
        if "not data" in str(err) or "not numeric" in str(err):
            return {"t": "unsupported", "v": _describe(value)}, {}
        raise


def _describe(v):
    t = type(v)
    if isinstance(v, np.ma.MaskedArray):
        return "a MaskedArray with masked values (return a plain array: np.asarray, or fill them)"
    if isinstance(v, np.ndarray):
        return f"an array of dtype {v.dtype}" if t is np.ndarray else f"a {t.__name__} (a subclass of ndarray)"
    if isinstance(v, (tuple, list, dict)):
        return f"a {t.__name__} holding an object that is not data"
    return f"a {_qualname(t)}"


def _qualname(t):
    return f"{t.__module__}:{t.__qualname__}"


def _ml_name(dt):
    name = str(dt)
    return name if name in ML_DTYPES and dt.kind == "V" else None


def _dtype_name(dt):
    return str(np.dtype(dt))


# ---- decoding --------------------------------------------------------------------------------
class _Decoder:
    def __init__(self, blobs, trusted):
        self.blobs, self.trusted, self.items = blobs, trusted, 0

    def array(self, node):
        name = node.get("blob")
        data = self.blobs.get(name) if isinstance(name, str) else None
        if not isinstance(data, (bytes, bytearray)):
            raise WireError("an array refers to a missing blob")
        if len(data) > MAX_BLOB_BYTES + 4096:
            raise WireError("an array too large")
        try:
            a = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as e:                              # noqa: BLE001: any malformed .npy
            raise WireError(f"a malformed array ({type(e).__name__})") from None
        if type(a) is not np.ndarray or a.dtype.kind not in NUMERIC_KINDS or a.dtype.names is not None:
            raise WireError("an array of a non-numeric dtype")
        ml = node.get("ml")
        if ml is not None:
            if ml not in ML_DTYPES or a.dtype != np.dtype(ML_DTYPES[ml]):
                raise WireError(f"a malformed {ml!r} array")
            import ml_dtypes  # noqa: F401  (registers the dtypes)
            a = a.view(np.dtype(ml))
        return a

    def dec(self, node, depth=0):
        if depth > MAX_DEPTH:
            raise WireError("nested too deeply")
        self.items += 1
        if self.items > MAX_ITEMS:
            raise WireError("too many items")
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise WireError("a malformed node")
        t, v = node["t"], node.get("v")
        if t == "const":
            if v is None or isinstance(v, bool):
                return v
            raise WireError("a malformed constant")
        if t == "int":
            if not isinstance(v, str) or len(v) > MAX_INT_DIGITS:
                raise WireError("a malformed int")
            return int(v)
        if t == "float":
            return _float(v)
        if t == "complex":
            if not (isinstance(v, list) and len(v) == 2):
                raise WireError("a malformed complex")
            return complex(_float(v[0]), _float(v[1]))
        if t == "str":
            if not isinstance(v, str) or len(v) > MAX_STR:
                raise WireError("a malformed string")
            return v
        if t == "array":
            return self.array(node)
        if t == "npscalar":
            a = self.array(node)
            if a.shape != ():
                raise WireError("a malformed numpy scalar")
            return a[()]
        if t in ("dtype", "dtype_type"):
            if not isinstance(v, str) or len(v) > 40:
                raise WireError("a malformed dtype")
            if v in ML_DTYPES:
                import ml_dtypes  # noqa: F401
            try:
                dt = np.dtype(v)
            except TypeError:
                raise WireError(f"an unknown dtype {v!r}") from None
            if dt.kind not in NUMERIC_KINDS and not _ml_name(dt):
                raise WireError(f"a non-numeric dtype {v!r}")
            return dt if t == "dtype" else dt.type
        if t == "generator":
            state = self.dec(v, depth + 1)
            return _generator(state)
        if t in ("tuple", "list"):
            if not isinstance(v, list):
                raise WireError(f"a malformed {t}")
            items = [self.dec(x, depth + 1) for x in v]
            return tuple(items) if t == "tuple" else items
        if t == "dict":
            keys, vals = node.get("k"), v
            if not (isinstance(keys, list) and isinstance(vals, list) and len(keys) == len(vals)):
                raise WireError("a malformed dict")
            out = {}
            for k, x in zip(keys, vals):
                key = self.dec(k, depth + 1)
                try:
                    hash(key)
                except TypeError:
                    raise WireError("a dict key that is not hashable") from None
                out[key] = self.dec(x, depth + 1)
            return out
        if t == "namedtuple":
            fields = node.get("fields")
            if not (isinstance(v, list) and isinstance(fields, list) and len(fields) == len(v)
                    and all(isinstance(f, str) and f.isidentifier() for f in fields)):
                raise WireError("a malformed namedtuple")
            items = [self.dec(x, depth + 1) for x in v]
            if self.trusted:
                return tuple(items)
            return _namedtuple_class(node.get("cls"), fields)(*items)
        if t == "dataclass":
            fields = node.get("fields")
            if self.trusted or not isinstance(fields, dict):
                return Unsupported(str(node.get("cls"))[:100])
            values = {k: self.dec(x, depth + 1) for k, x in fields.items()}
            return _dataclass_class(node.get("cls"), list(values))(**values)
        if t == "pickle":
            if self.trusted:
                raise WireError("a pickle cannot cross into the grader")
            return pickle.loads(self.blobs[node["blob"]])
        if t == "unsupported":
            return Unsupported(str(v)[:200])
        if t == "source":
            if self.trusted:
                raise WireError("code cannot cross into the grader")
            env = self.dec(node.get("env"), depth + 1)
            return _compile_source(v, env)
        raise WireError(f"an unknown node type {t!r}")


def _compile_source(text, env):
    """A function the grader wrote as text (preln.course.code), rebuilt in the sandbox."""
    import math as _math
    namespace = {"np": np, "math": _math, **env}
    try:
        import ml_dtypes
        namespace["ml_dtypes"] = ml_dtypes
    except ImportError:
        pass
    fn = eval(text, namespace)                              # noqa: S307: the grader's own code
    return fn


class Batch:
    """Several values sharing one blob store (the inputs of all of a question's calls)."""

    def __init__(self, allow_pickle=True):
        self._enc = _Encoder(allow_pickle, False)
        self.trees = []

    def add(self, value):
        self.trees.append(self._enc.enc(value))
        return len(self.trees) - 1

    @property
    def blobs(self):
        return self._enc.blobs

    def document(self):
        return {"tree": self.trees, "blobs": {k: base64.b64encode(v).decode("ascii") for k, v in self.blobs.items()}}


def _float(v):
    if not isinstance(v, str) or len(v) > 40:
        raise WireError("a malformed float")
    try:
        return float.fromhex(v) if v not in ("inf", "-inf", "nan") else float(v)
    except ValueError:
        raise WireError("a malformed float") from None


def _generator(state):
    if not isinstance(state, dict) or not isinstance(state.get("bit_generator"), str):
        raise WireError("a malformed random generator")
    name = state["bit_generator"]
    if name not in ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937"):
        raise WireError(f"an unknown bit generator {name!r}")
    bg = getattr(np.random, name)()
    try:
        bg.state = state
    except (TypeError, ValueError, KeyError):
        raise WireError("a malformed random generator state") from None
    return np.random.Generator(bg)


def _import_class(path):
    if not isinstance(path, str) or ":" not in path:
        return None
    module, qualname = path.split(":", 1)
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:                                       # noqa: BLE001: not in this view
        return None
    return obj if isinstance(obj, type) else None


_STAND_INS = {}


def _namedtuple_class(path, fields):
    cls = _import_class(path)
    if cls is not None and getattr(cls, "_fields", None) == tuple(fields):
        return cls
    key = (path, tuple(fields))
    if key not in _STAND_INS:
        name = str(path).split(":")[-1].split(".")[-1] if path else "Record"
        _STAND_INS[key] = collections.namedtuple(name if name.isidentifier() else "Record", fields)
    return _STAND_INS[key]


def _dataclass_class(path, fields):
    cls = _import_class(path)
    if cls is not None and dataclasses.is_dataclass(cls):
        return cls
    key = (path, tuple(fields))
    if key not in _STAND_INS:
        name = str(path).split(":")[-1].split(".")[-1] if path else "Record"
        _STAND_INS[key] = dataclasses.make_dataclass(name if name.isidentifier() else "Record", fields,
                                                     frozen=True)
    return _STAND_INS[key]


def decode(tree, blobs, trusted=True):
    """The value of ``tree``; ``trusted=True`` is the grader reading the sandbox's data."""
    return _Decoder(blobs, trusted).dec(tree)


def map_arrays(value, fn):
    """``value`` with every ndarray in it replaced by ``fn(array)``, depth first through tuples, lists
    and dict values in their order (other values as they are). Both sides of the boundary walk a
    call's read-only arguments this way: the k-th array is the grader's k-th file."""
    if isinstance(value, np.ndarray):
        return fn(value)
    if type(value) is tuple:
        return tuple(map_arrays(v, fn) for v in value)
    if type(value) is list:
        return [map_arrays(v, fn) for v in value]
    if type(value) is dict:
        return {k: map_arrays(v, fn) for k, v in value.items()}
    return value


# ---- bundles: a tree and its blobs in one JSON document ---------------------------------------
def dumps(tree, blobs):
    return json.dumps({"tree": tree, "blobs": {k: base64.b64encode(v).decode("ascii") for k, v in blobs.items()}})


def loads(text, max_bytes=MAX_TOTAL_BYTES * 2):
    """(tree, blobs) from :func:`dumps`' text, bounded in size."""
    if len(text) > max_bytes:
        raise WireError("a bundle too large")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise WireError("a bundle that is not JSON") from None
    return bundle_parts(doc)


def bundle_parts(doc):
    if not isinstance(doc, dict) or not isinstance(doc.get("blobs"), dict):
        raise WireError("a malformed bundle")
    blobs = {}
    for k, v in doc["blobs"].items():
        if not isinstance(v, str):
            raise WireError("a malformed blob")
        try:
            blobs[k] = base64.b64decode(v.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError):
            raise WireError("a malformed blob") from None
    return doc.get("tree"), blobs


def bundle(value, allow_pickle=False):
    """The JSON-able document of ``value`` (tree + base64 blobs)."""
    tree, blobs = encode(value, allow_pickle=allow_pickle)
    return {"tree": tree, "blobs": {k: base64.b64encode(v).decode("ascii") for k, v in blobs.items()}}


def roundtrip(value):
    """``value`` as the grader would receive it from a sandbox (for the in-process mutation runs)."""
    tree, blobs = encode_result(value)
    return decode(tree, blobs, trusted=True)

