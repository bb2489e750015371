/* The stored batch format's common case in C: batches without headers (see batch_codec.py for the layout).

   batch_codec.py stays the reference and the fallback: every function here returns None for what it does not
   handle (a record with headers, a value that is not exactly bytes or None, a timestamp that is not an int in
   64 bits, a record over the size limit, an empty batch), and the Python code then does the work and raises the
   precise error. Its output is byte for byte the Python encoder's (tests/unit/test_batch_codec.py checks both).
   Built by `pip install` when a C compiler is there (an optional extension); without it, Python does it all. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "../_message_slots.h"

#define HEADER_SIZE 13 /* magic u8 | crc32 u32 | count u32 | body_len u32 */
#define MAGIC 1

static PyObject *crc32_func; /* zlib.crc32: the checksum Python computes, over the same bytes */

static void put_u32(char *at, uint32_t v) {
    for (int i = 0; i < 4; i++) at[i] = (char)((v >> (8 * i)) & 0xff);
}

static void put_i64(char *at, int64_t v) {
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < 8; i++) at[i] = (char)((u >> (8 * i)) & 0xff);
}

static uint32_t get_u32(const unsigned char *at) {
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
}

static int64_t get_i64(const unsigned char *at) {
    uint64_t u = 0;
    for (int i = 7; i >= 0; i--) u = u << 8 | at[i];
    return (int64_t)u;
}

/* The length a key or value takes (-1: None), or -2 if it is neither exactly bytes nor None. */
static Py_ssize_t field_length(PyObject *field) {
    if (field == Py_None) return -1;
    if (PyBytes_CheckExact(field)) return PyBytes_GET_SIZE(field);
    return -2;
}

/* The checksum of blob[5:], by zlib.crc32 on a view of it (no copy); -1 with an exception set if it failed. */
static int64_t checksum(char *blob, Py_ssize_t size) {
    PyObject *view = PyMemoryView_FromMemory(blob + 5, size - 5, PyBUF_READ);
    if (view == NULL) return -1;
    PyObject *crc = PyObject_CallOneArg(crc32_func, view);
    Py_DECREF(view);
    if (crc == NULL) return -1;
    unsigned long value = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (value == (unsigned long)-1 && PyErr_Occurred()) return -1;
    return (int64_t)value;
}

/* The bytes of keys and values in a batch this code takes (see the top), or -1 for one left to Python. A list or
   tuple of records only (a generator would be used up before Python's fallback), and a limit that is a plain int. */
static Py_ssize_t plain_batch(PyObject *records, PyObject *limit) {
    if (!(PyList_CheckExact(records) || PyTuple_CheckExact(records)) || !PyLong_CheckExact(limit)) return -1;
    int overflow = 0;
    long long max_record_bytes = PyLong_AsLongLongAndOverflow(limit, &overflow);
    if (overflow != 0 || max_record_bytes < 0) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(records);
    PyObject **items = PySequence_Fast_ITEMS(records);
    Py_ssize_t data = 0;
    if (count == 0 || count > 0x7fffffff / 20) return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = items[i];
        /* A tuple, or a subclass that iterates as one (Record, a namedtuple): Python unpacks it by iterating. */
        if (!PyTuple_Check(record) || Py_TYPE(record)->tp_iter != PyTuple_Type.tp_iter
            || PyTuple_GET_SIZE(record) != 4) return -1;
        Py_ssize_t key = field_length(PyTuple_GET_ITEM(record, 0));
        Py_ssize_t value = field_length(PyTuple_GET_ITEM(record, 1));
        PyObject *headers = PyTuple_GET_ITEM(record, 2);
        if (key < -1 || value < -1 || !PyLong_CheckExact(PyTuple_GET_ITEM(record, 3))) return -1;
        int out_of_range = 0; /* a timestamp beyond 64 bits: Python refuses it (an exact int sets only the flag) */
        (void)PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(record, 3), &out_of_range);
        if (out_of_range) return -1;
        if (headers != Py_None && !((PyList_CheckExact(headers) || PyTuple_CheckExact(headers))
                                    && PySequence_Fast_GET_SIZE(headers) == 0)) return -1;
        Py_ssize_t size = (key > 0 ? key : 0) + (value > 0 ? value : 0);
        if (size > max_record_bytes || size > 0x7fffffff || data > 0x7fffffff - size) return -1;
        data += size;
    }
    return data;
}

/* check(records, max_record_bytes) -> True | None: True if batch_codec.check would pass the batch. */
static PyObject *check(PyObject *self, PyObject *args) {
    PyObject *records, *limit;
    if (!PyArg_ParseTuple(args, "OO", &records, &limit)) return NULL;
    if (plain_batch(records, limit) < 0) Py_RETURN_NONE;
    Py_RETURN_TRUE;
}

/* encode(records, max_record_bytes) -> bytes | None */
static PyObject *encode(PyObject *self, PyObject *args) {
    PyObject *records, *limit;
    if (!PyArg_ParseTuple(args, "OO", &records, &limit)) return NULL;
    Py_ssize_t data = plain_batch(records, limit);
    if (data < 0) Py_RETURN_NONE;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(records);
    PyObject **items = PySequence_Fast_ITEMS(records);
    Py_ssize_t body = 20 * count + data;
    if (body > 0x7fffffff - HEADER_SIZE) Py_RETURN_NONE;
    PyObject *blob = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + body);
    if (blob == NULL) return NULL;
    char *out = PyBytes_AS_STRING(blob);
    char *timestamps = out + HEADER_SIZE, *key_lens = timestamps + 8 * count, *value_lens = key_lens + 4 * count;
    char *header_lens = value_lens + 4 * count, *keys = header_lens + 4 * count, *values = keys;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(items[i], 0);
        if (key != Py_None) values += PyBytes_GET_SIZE(key);
    }
    memset(header_lens, 0, 4 * count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = items[i];
        int overflow = 0;
        long long timestamp = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(record, 3), &overflow);
        if (overflow != 0) {  /* not in 64 bits: Python says so */
            Py_DECREF(blob);
            Py_RETURN_NONE;
        }
        put_i64(timestamps + 8 * i, timestamp);
        PyObject *key = PyTuple_GET_ITEM(record, 0), *value = PyTuple_GET_ITEM(record, 1);
        Py_ssize_t n = key == Py_None ? -1 : PyBytes_GET_SIZE(key);
        put_u32(key_lens + 4 * i, (uint32_t)(int32_t)n);
        if (n > 0) {
            memcpy(keys, PyBytes_AS_STRING(key), n);
            keys += n;
        }
        n = value == Py_None ? -1 : PyBytes_GET_SIZE(value);
        put_u32(value_lens + 4 * i, (uint32_t)(int32_t)n);
        if (n > 0) {
            memcpy(values, PyBytes_AS_STRING(value), n);
            values += n;
        }
    }
    out[0] = MAGIC;
    put_u32(out + 5, (uint32_t)count);
    put_u32(out + 9, (uint32_t)body);
    int64_t crc = checksum(out, HEADER_SIZE + body);
    if (crc < 0) {
        Py_DECREF(blob);
        return NULL;
    }
    put_u32(out + 1, (uint32_t)crc);
    return blob;
}

/* Bytes objects for the items of one column (keys or values) from record `skip` on, stored back to back from
   `start`; NULL with an exception set on failure. Advances *end past the column. */
static PyObject *column(const unsigned char *blob, const unsigned char *lengths, Py_ssize_t count, Py_ssize_t skip,
                        Py_ssize_t start, Py_ssize_t size, Py_ssize_t *end) {
    PyObject *items = PyList_New(count - skip);
    if (items == NULL) return NULL;
    Py_ssize_t at = start;
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t n = (int32_t)get_u32(lengths + 4 * i);
        if (n > 0 && at > size - n) {
            Py_DECREF(items);
            PyErr_SetString(PyExc_ValueError, "record lengths do not match the batch size");
            return NULL;
        }
        if (i >= skip) {
            PyObject *item;
            if (n < 0) {
                item = Py_NewRef(Py_None);
            } else {
                item = PyBytes_FromStringAndSize((const char *)blob + at, n);
                if (item == NULL) {
                    Py_DECREF(items);
                    return NULL;
                }
            }
            PyList_SET_ITEM(items, i - skip, item);
        }
        if (n > 0) at += n;
    }
    *end = at;
    return items;
}

/* (keys, values, timestamps) | None: an intact batch's columns from record `skip` on (its header and checksum are
   checked before, by Python); None if a record has headers; ValueError if damaged. */
static PyObject *columns_of(const Py_buffer *buffer, Py_ssize_t skip) {
    const unsigned char *blob = buffer->buf;
    Py_ssize_t size = buffer->len;
    PyObject *result = NULL, *keys = NULL, *values = NULL, *timestamps = NULL;
    if (size < HEADER_SIZE) {
        PyErr_SetString(PyExc_ValueError, "shorter than a batch header");
        goto done;
    }
    Py_ssize_t count = get_u32(blob + 5);
    if (count > (size - HEADER_SIZE) / 20) {
        PyErr_SetString(PyExc_ValueError, "record lengths do not match the batch size");
        goto done;
    }
    skip = skip < 0 ? 0 : (skip > count ? count : skip);
    const unsigned char *stamps = blob + HEADER_SIZE, *key_lens = stamps + 8 * count;
    const unsigned char *value_lens = key_lens + 4 * count, *header_lens = value_lens + 4 * count;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (get_u32(header_lens + 4 * i) != 0) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    Py_ssize_t key_end, value_end;
    keys = column(blob, key_lens, count, skip, HEADER_SIZE + 20 * count, size, &key_end);
    if (keys == NULL) goto done;
    values = column(blob, value_lens, count, skip, key_end, size, &value_end);
    if (values == NULL) goto done;
    if (value_end != size) {
        PyErr_SetString(PyExc_ValueError, "record lengths do not match the batch size");
        goto done;
    }
    timestamps = PyList_New(count - skip);
    if (timestamps == NULL) goto done;
    for (Py_ssize_t i = skip; i < count; i++) {
        PyObject *stamp = PyLong_FromLongLong(get_i64(stamps + 8 * i));
        if (stamp == NULL) goto done;
        PyList_SET_ITEM(timestamps, i - skip, stamp);
    }
    result = PyTuple_Pack(3, keys, values, timestamps);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(timestamps);
    return result;
}

/* columns(blob, skip): see columns_of. */
static PyObject *columns(PyObject *self, PyObject *args) {
    Py_buffer buffer;
    Py_ssize_t skip;
    if (!PyArg_ParseTuple(args, "y*n", &buffer, &skip)) return NULL;
    PyObject *result = columns_of(&buffer, skip);
    PyBuffer_Release(&buffer);
    return result;
}

/* messages(blob, skip, topic, partition, first_offset, type) -> list | None: the batch's records from `skip` on
   as `type` (onceflow's Message) instances of the topic's partition, numbered from first_offset; None where
   columns() gives None, or where `type`'s fields are not plain slots (see _message_slots.h). A Message made in
   Python cost ~0.25 us a record, a third of reading one from the embedded store. */
static PyObject *messages(PyObject *self, PyObject *args) {
    Py_buffer buffer;
    Py_ssize_t skip;
    PyObject *topic, *partition, *type;
    long long first_offset;
    if (!PyArg_ParseTuple(args, "y*nOOLO", &buffer, &skip, &topic, &partition, &first_offset, &type)) return NULL;
    Py_ssize_t offsets[MESSAGE_FIELDS];
    PyObject *split = PyType_Check(type) && message_slots((PyTypeObject *)type, offsets) ? columns_of(&buffer, skip)
                                                                                         : Py_NewRef(Py_None);
    PyBuffer_Release(&buffer);
    if (split == NULL || split == Py_None) return split;
    PyObject *keys = PyTuple_GET_ITEM(split, 0), *values = PyTuple_GET_ITEM(split, 1);
    PyObject *timestamps = PyTuple_GET_ITEM(split, 2);
    Py_ssize_t count = PyList_GET_SIZE(keys);
    PyObject *out = PyList_New(0); /* appended to: never a list with empty items, should a collection see it */
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *fields[MESSAGE_FIELDS] = {
            Py_NewRef(topic), Py_NewRef(partition), PyLong_FromLongLong(first_offset + i),
            Py_NewRef(PyList_GET_ITEM(keys, i)), Py_NewRef(PyList_GET_ITEM(values, i)), Py_NewRef(Py_None),
            Py_NewRef(PyList_GET_ITEM(timestamps, i)), Py_NewRef(Py_None)};
        PyObject *message = NULL;
        if (fields[M_OFFSET] != NULL) {
            message = new_message((PyTypeObject *)type, offsets, fields);
        } else {
            for (int f = 0; f < MESSAGE_FIELDS; f++) Py_XDECREF(fields[f]);
        }
        if (message == NULL || PyList_Append(out, message) < 0) Py_CLEAR(out);
        Py_XDECREF(message);
    }
    Py_DECREF(split);
    return out;
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, "True if batch_codec.check would pass the batch, or None: see there."},
    {"encode", encode, METH_VARARGS, "A batch without headers encoded, or None: see batch_codec.encode."},
    {"columns", columns, METH_VARARGS, "A batch's columns without headers, or None: see batch_codec._split."},
    {"messages", messages, METH_VARARGS, "A batch's records without headers as Messages, or None: see decode."},
    KEEP_COLLECTABLE_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batch_codec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__batch_codec(void) {
    PyObject *zlib = PyImport_ImportModule("zlib");
    if (zlib == NULL) return NULL;
    crc32_func = PyObject_GetAttrString(zlib, "crc32");
    Py_DECREF(zlib);
    if (crc32_func == NULL) return NULL;
    PyObject *created = PyModule_Create(&module);
    if (created == NULL) Py_CLEAR(crc32_func);
    return created;
}
