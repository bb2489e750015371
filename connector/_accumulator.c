/* A Producer's per-record hot path, in C: accumulator.py's Batch and Accumulator, the same fields and the same
   outcomes (accumulator.py is the reference the tests compare this with, and the fallback). A Python call of
   Producer.produce cost 1.5 us a record; a call of this one ~0.5, of which queuing the record is ~0.3.

   add() takes the Producer's lock (an RLock, given at construction); route() and enqueue() are called under it.
   The clocks are Python's own (time.time() and time.monotonic() read the same ones), so deadlines set here compare
   with Python's on every platform. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum { NOT_QUEUED, QUEUED, FULL, DUE };

/* Seconds on Python's wall clock (time.time) or monotonic clock (time.monotonic); -1 with an error set. */
static double clock_seconds(int monotonic) {
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t now;
    if ((monotonic ? PyTime_Monotonic(&now) : PyTime_Time(&now)) < 0) return -1.0;
    return PyTime_AsSecondsDouble(now);
#else
    return _PyTime_AsSecondsDouble(monotonic ? _PyTime_GetMonotonicClock() : _PyTime_GetSystemClock());
#endif
}

/* -- Batch -------------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    double deadline;
    PyObject *fields;    /* list of record field tuples */
    PyObject *callbacks; /* dict: index -> delivery callback */
    PyObject *pinned;    /* set of indexes */
    Py_ssize_t size;
} Batch;

static PyTypeObject BatchType;

static Batch *batch_new(double deadline) {
    Batch *self = PyObject_GC_New(Batch, &BatchType);
    if (self == NULL) return NULL;
    self->deadline = deadline;
    self->size = 0;
    self->fields = PyList_New(0);
    self->callbacks = PyDict_New();
    self->pinned = PySet_New(NULL);
    if (self->fields == NULL || self->callbacks == NULL || self->pinned == NULL) {
        Py_XDECREF(self->fields);
        Py_XDECREF(self->callbacks);
        Py_XDECREF(self->pinned);
        self->fields = self->callbacks = self->pinned = NULL;
        Py_DECREF(self);
        return NULL;
    }
    PyObject_GC_Track(self);
    return self;
}

static PyObject *Batch_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    double deadline;
    static char *names[] = {"deadline", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "d:Batch", names, &deadline)) return NULL;
    return (PyObject *)batch_new(deadline);
}

static int Batch_traverse(Batch *self, visitproc visit, void *arg) {
    Py_VISIT(self->fields);
    Py_VISIT(self->callbacks);
    Py_VISIT(self->pinned);
    return 0;
}

static int Batch_clear(Batch *self) {
    Py_CLEAR(self->fields);
    Py_CLEAR(self->callbacks);
    Py_CLEAR(self->pinned);
    return 0;
}

static void Batch_dealloc(Batch *self) {
    PyObject_GC_UnTrack(self);
    Batch_clear(self);
    PyObject_GC_Del(self);
}

static Py_ssize_t Batch_len(Batch *self) { return self->fields == NULL ? 0 : PyList_GET_SIZE(self->fields); }

static PyMemberDef Batch_members[] = {
    {"deadline", T_DOUBLE, offsetof(Batch, deadline), 0, NULL},
    {"fields", T_OBJECT_EX, offsetof(Batch, fields), READONLY, NULL},
    {"callbacks", T_OBJECT_EX, offsetof(Batch, callbacks), READONLY, NULL},
    {"pinned", T_OBJECT_EX, offsetof(Batch, pinned), READONLY, NULL},
    {"size", T_PYSSIZET, offsetof(Batch, size), 0, NULL},
    {NULL},
};

static PySequenceMethods Batch_as_sequence = {.sq_length = (lenfunc)Batch_len};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "onceflow.connector._accumulator.Batch",
    .tp_doc = "Records queued for one partition (accumulator.Batch).",
    .tp_basicsize = sizeof(Batch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Batch_tp_new,
    .tp_traverse = (traverseproc)Batch_traverse,
    .tp_clear = (inquiry)Batch_clear,
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_members = Batch_members,
    .tp_as_sequence = &Batch_as_sequence,
};

/* -- Accumulator ---------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *batches;    /* dict: (topic, partition) -> Batch */
    PyObject *current;    /* dict: topic -> tuple of the open epoch's partitions */
    PyObject *partitions; /* dict: topic -> frozenset of every partition id */
    PyObject *sticky;     /* dict: topic -> partition of unkeyed records */
    PyObject *default_callback;
    PyObject *acquire, *release; /* the Producer's lock's */
    Py_ssize_t in_flight, batch_records, batch_bytes, max_queued, max_bytes;
    Py_ssize_t queued, queued_bytes; /* in all batches: counted for a transaction's records only */
    double linger_s, next_due;
    char accepting, transactional;
} Accumulator;

/* The CRC-32 of zlib.crc32 (partitioner.index_for_key's hash), by table. */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc32_of(const unsigned char *data, Py_ssize_t length) {
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < length; i++) c = crc_table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* The partition (borrowed) the topic's records of this key go to; NULL with no error set if the topic's epoch is
   not known. */
static PyObject *route(Accumulator *self, PyObject *topic, PyObject *key) {
    PyObject *current = PyDict_GetItemWithError(self->current, topic);
    if (current == NULL || !PyTuple_CheckExact(current) || PyTuple_GET_SIZE(current) == 0) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(current);
    if (key != Py_None) {
        uint64_t hash = crc32_of((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        return PyTuple_GET_ITEM(current, (Py_ssize_t)((hash * (uint64_t)count) >> 32));
    }
    PyObject *sticky = PyDict_GetItemWithError(self->sticky, topic);
    if (sticky == NULL && PyErr_Occurred()) return NULL;
    if (sticky != NULL) {
        int in = PySequence_Contains(current, sticky);
        if (in < 0) return NULL;
        if (in) return sticky;
    }
    sticky = PyTuple_GET_ITEM(current, 0);
    return PyDict_SetItem(self->sticky, topic, sticky) < 0 ? NULL : sticky;
}

/* Note the record's index in the batch in a dict (its callback) or a set (pinned); -1 with an error set. */
static int note_index(PyObject *where, Py_ssize_t index, PyObject *callback) {
    PyObject *at = PyLong_FromSsize_t(index);
    if (at == NULL) return -1;
    int failed = callback != NULL ? PyDict_SetItem(where, at, callback) : PySet_Add(where, at);
    Py_DECREF(at);
    return failed ? -1 : 0;
}

/* accumulator.Accumulator.enqueue: QUEUED, FULL or DUE; -1 with an error set. Allocating may run Python code (a
   collection's finalizers, which may even produce to this Producer): the batch is held, not borrowed. */
static int enqueue(Accumulator *self, PyObject *tp, PyObject *fields, PyObject *callback, int routed,
                   Py_ssize_t size) {
    double now = self->transactional ? 0.0 : clock_seconds(1);
    if (now == -1.0 && PyErr_Occurred()) return -1;
    Batch *batch = (Batch *)PyDict_GetItemWithError(self->batches, tp);
    if (batch == NULL) {
        if (PyErr_Occurred()) return -1;
        Batch *made = batch_new(self->transactional ? Py_HUGE_VAL : now + self->linger_s);
        /* setdefault: a collection's finalizer may have produced to this partition while the batch was made */
        batch = made == NULL ? NULL : (Batch *)PyDict_SetDefault(self->batches, tp, (PyObject *)made);
        Py_XDECREF(made);
        if (batch == NULL) return -1;
        if (Py_IS_TYPE(batch, &BatchType) && batch->deadline < self->next_due) self->next_due = batch->deadline;
    }
    if (!Py_IS_TYPE(batch, &BatchType)) {
        PyErr_Format(PyExc_TypeError, "a queued batch of %R is a %s, not a Batch", tp, Py_TYPE(batch)->tp_name);
        return -1;
    }
    Py_INCREF(batch);
    Py_ssize_t index = PyList_GET_SIZE(batch->fields);
    if ((callback != Py_None && note_index(batch->callbacks, index, callback) < 0) ||
        (!routed && note_index(batch->pinned, index, NULL) < 0) || PyList_Append(batch->fields, fields) < 0) {
        Py_DECREF(batch);
        return -1;
    }
    batch->size += size;
    int full = index + 1 >= self->batch_records || batch->size >= self->batch_bytes;
    Py_DECREF(batch);
    if (self->transactional) {
        self->queued += 1;
        self->queued_bytes += size;
        return self->queued >= self->batch_records || self->queued_bytes >= self->batch_bytes ? FULL : QUEUED;
    }
    return full ? FULL : self->next_due <= now ? DUE : QUEUED;
}

static PyObject *Accumulator_enqueue(Accumulator *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "enqueue() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    int routed = PyObject_IsTrue(args[3]);
    if (routed < 0) return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[4]);
    if (size == -1 && PyErr_Occurred()) return NULL;
    int outcome = enqueue(self, args[0], args[1], args[2], routed, size);
    return outcome < 0 ? NULL : PyLong_FromLong(outcome);
}

/* accumulator.Accumulator.add, under the lock. */
static PyObject *add(Accumulator *self, PyObject *const *args) {
    PyObject *topic = args[0], *value = args[1], *key = args[2], *partition = args[3], *callback = args[4],
             *timestamp = args[5];
    if (!self->accepting || self->in_flight >= self->max_queued) return PyLong_FromLong(NOT_QUEUED);
    if ((value != Py_None && !PyBytes_CheckExact(value)) || (key != Py_None && !PyBytes_CheckExact(key)) ||
        !PyLong_CheckExact(timestamp) || (partition != Py_None && !PyLong_CheckExact(partition)) ||
        !PyUnicode_CheckExact(topic))
        return PyLong_FromLong(NOT_QUEUED);
    Py_ssize_t size = (key == Py_None ? 0 : PyBytes_GET_SIZE(key)) + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
    if (size > self->max_bytes) return PyLong_FromLong(NOT_QUEUED);

    /* What may run Python code first (a callback's truth, a clock): the partition routed to is then held at once */
    int given = callback == Py_None ? 0 : PyObject_IsTrue(callback); /* Python: callback or default_callback */
    if (given < 0) return NULL;
    if (!given) callback = self->default_callback;
    int zero = PyObject_Not(timestamp); /* Python: timestamp or int(time.time() * 1000) */
    if (zero < 0) return NULL;
    PyObject *stamp;
    if (zero) {
        double now = clock_seconds(0);
        if (now == -1.0 && PyErr_Occurred()) return NULL;
        if ((stamp = PyLong_FromDouble(now * 1000)) == NULL) return NULL;
    } else {
        stamp = Py_NewRef(timestamp);
    }

    int routed = partition == Py_None;
    if (!routed) {
        int overflow;
        long long id = PyLong_AsLongLongAndOverflow(partition, &overflow);
        if (id == -1 && PyErr_Occurred()) {
            Py_DECREF(stamp);
            return NULL;
        }
        routed = !overflow && id == -1;
    }
    PyObject *target; /* borrowed from the routing dicts, or the caller's partition */
    int in = 1;
    if (routed) {
        target = route(self, topic, key);
        in = target != NULL;
    } else {
        PyObject *known = PyDict_GetItemWithError(self->partitions, topic);
        in = known != NULL && (PySet_Check(known) || PyFrozenSet_Check(known)) ? PySet_Contains(known, partition) : 0;
        target = partition;
    }
    if (in <= 0) {
        Py_DECREF(stamp);
        return PyErr_Occurred() ? NULL : PyLong_FromLong(NOT_QUEUED);
    }
    Py_INCREF(target); /* before allocating: a collection's finalizer may replace the dict's tuple (a produce) */
    PyObject *tp = PyTuple_Pack(2, topic, target);
    Py_DECREF(target);
    PyObject *fields = tp == NULL ? NULL : PyTuple_New(4);
    if (fields == NULL) {
        Py_XDECREF(tp);
        Py_DECREF(stamp);
        return NULL;
    }
    Py_INCREF(key);
    PyTuple_SET_ITEM(fields, 0, key);
    Py_INCREF(value);
    PyTuple_SET_ITEM(fields, 1, value);
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(fields, 2, Py_None);
    PyTuple_SET_ITEM(fields, 3, stamp); /* steals */
    /* Bytes, None and an int cannot be part of a reference cycle: the collector need not track the tuple (Python
       untracks such tuples itself, but only once a collection has visited them, over and over in a large batch). */
    PyObject_GC_UnTrack(fields);
    /* Checked again: Python code may have run since (a callback's truth, a collection's finalizers), and ended the
       transaction on this thread (the lock is re-entrant) */
    int outcome = self->accepting ? enqueue(self, tp, fields, callback, routed, size) : NOT_QUEUED;
    Py_DECREF(fields);
    Py_DECREF(tp);
    if (outcome < 0) return NULL;
    if (outcome != NOT_QUEUED && (!self->transactional || callback != Py_None)) self->in_flight += 1;
    return PyLong_FromLong(outcome);
}

/* add() under the accumulator's lock. */
static PyObject *locked_add(Accumulator *self, PyObject *const *args) {
    if (self->acquire == NULL) {
        PyErr_SetString(PyExc_TypeError, "Accumulator.__init__ was not called");
        return NULL;
    }
    PyObject *locked = PyObject_CallNoArgs(self->acquire);
    if (locked == NULL) return NULL;
    Py_DECREF(locked);
    PyObject *outcome = add(self, args);
    PyObject *error_type, *error, *traceback;
    PyErr_Fetch(&error_type, &error, &traceback); /* releasing must not see (or lose) add's error */
    PyObject *released = PyObject_CallNoArgs(self->release);
    if (released == NULL) {
        Py_XDECREF(error_type);
        Py_XDECREF(error);
        Py_XDECREF(traceback);
        Py_XDECREF(outcome);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(error_type, error, traceback);
    return outcome;
}

/* add(topic, value, key, partition, callback, timestamp): accumulator.Accumulator.add. */
static PyObject *Accumulator_add(Accumulator *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "add() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    return locked_add(self, args);
}

static int Accumulator_init(Accumulator *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"lock", "linger_s", "batch_records", "batch_bytes", "max_queued", "max_bytes",
                            "default_callback", "transactional", NULL};
    PyObject *lock, *default_callback;
    int transactional;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OdnnnnOp:Accumulator", names, &lock, &self->linger_s,
                                     &self->batch_records, &self->batch_bytes, &self->max_queued, &self->max_bytes,
                                     &default_callback, &transactional))
        return -1;
    self->transactional = (char)transactional;
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    PyObject *release = acquire == NULL ? NULL : PyObject_GetAttrString(lock, "release");
    if (release == NULL) {
        Py_XDECREF(acquire);
        return -1;
    }
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_INCREF(default_callback);
    Py_XSETREF(self->default_callback, default_callback);
    self->in_flight = self->queued = self->queued_bytes = 0;
    self->next_due = Py_HUGE_VAL;
    self->accepting = 1;
    return 0;
}

static PyObject *Accumulator_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Accumulator *self = (Accumulator *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->batches = PyDict_New();
    self->current = PyDict_New();
    self->partitions = PyDict_New();
    self->sticky = PyDict_New();
    self->default_callback = Py_NewRef(Py_None);
    if (self->batches == NULL || self->current == NULL || self->partitions == NULL || self->sticky == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int Accumulator_traverse(Accumulator *self, visitproc visit, void *arg) {
    Py_VISIT(self->batches);
    Py_VISIT(self->current);
    Py_VISIT(self->partitions);
    Py_VISIT(self->sticky);
    Py_VISIT(self->default_callback);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    return 0;
}

static int Accumulator_clear(Accumulator *self) {
    Py_CLEAR(self->batches);
    Py_CLEAR(self->current);
    Py_CLEAR(self->partitions);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->default_callback);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    return 0;
}

static void Accumulator_dealloc(Accumulator *self) {
    PyObject_GC_UnTrack(self);
    Accumulator_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Accumulator_route(Accumulator *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || (args[1] != Py_None && !PyBytes_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "route() takes a topic and a key (bytes or None)");
        return NULL;
    }
    PyObject *target = route(self, args[0], args[1]);
    if (target == NULL && PyErr_Occurred()) return NULL;
    return Py_NewRef(target == NULL ? Py_None : target);
}

static PyObject *Accumulator_take(Accumulator *self, PyObject *unused) {
    PyObject *taken = PyDict_Copy(self->batches);
    if (taken == NULL) return NULL;
    PyDict_Clear(self->batches);
    self->queued = self->queued_bytes = 0;
    self->next_due = Py_HUGE_VAL;
    return taken;
}

static PyMethodDef Accumulator_methods[] = {
    {"take", (PyCFunction)Accumulator_take, METH_NOARGS, "take(): see accumulator.Accumulator.take"},
    {"route", (PyCFunction)(void (*)(void))Accumulator_route, METH_FASTCALL,
     "route(topic, key): see accumulator.Accumulator.route"},
    {"add", (PyCFunction)(void (*)(void))Accumulator_add, METH_FASTCALL,
     "add(topic, value, key, partition, callback, timestamp): see accumulator.Accumulator.add"},
    {"enqueue", (PyCFunction)(void (*)(void))Accumulator_enqueue, METH_FASTCALL,
     "enqueue(tp, fields, callback, routed, size): see accumulator.Accumulator.enqueue"},
    {NULL},
};

static PyMemberDef Accumulator_members[] = {
    {"batches", T_OBJECT_EX, offsetof(Accumulator, batches), READONLY, NULL},
    {"current", T_OBJECT_EX, offsetof(Accumulator, current), READONLY, NULL},
    {"partitions", T_OBJECT_EX, offsetof(Accumulator, partitions), READONLY, NULL},
    {"sticky", T_OBJECT_EX, offsetof(Accumulator, sticky), READONLY, NULL},
    {"default_callback", T_OBJECT_EX, offsetof(Accumulator, default_callback), READONLY, NULL},
    {"in_flight", T_PYSSIZET, offsetof(Accumulator, in_flight), 0, NULL},
    {"next_due", T_DOUBLE, offsetof(Accumulator, next_due), 0, NULL},
    {"accepting", T_BOOL, offsetof(Accumulator, accepting), 0, NULL},
    {"transactional", T_BOOL, offsetof(Accumulator, transactional), READONLY, NULL},
    {"queued", T_PYSSIZET, offsetof(Accumulator, queued), READONLY, NULL},
    {NULL},
};

static PyTypeObject AccumulatorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "onceflow.connector._accumulator.Accumulator",
    .tp_doc = "A Producer's queued batches and routing (accumulator.Accumulator).",
    .tp_basicsize = sizeof(Accumulator),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Accumulator_tp_new,
    .tp_init = (initproc)Accumulator_init,
    .tp_traverse = (traverseproc)Accumulator_traverse,
    .tp_clear = (inquiry)Accumulator_clear,
    .tp_dealloc = (destructor)Accumulator_dealloc,
    .tp_methods = Accumulator_methods,
    .tp_members = Accumulator_members,
};

/* -- Produce: Producer.produce's fast path ------------------------------------------------------------------- */

/* A method descriptor: Producer.produce as accumulator.fast_produce makes it. A usual record (see accumulator.py)
   goes to the Producer's accumulator (its ``_queue``) with no Python frame; any other call, with its arguments as
   given, goes to the wrapped ``full`` path (which raises what a bad call raises). */
typedef struct {
    PyObject_HEAD
    PyObject *full;
    vectorcallfunc vectorcall;
} Produce;

enum { P_SELF, P_TOPIC, P_VALUE, P_KEY, P_PARTITION, P_ON_DELIVERY, P_TIMESTAMP, P_HEADERS, P_POSITIONAL,
       P_CALLBACK = P_POSITIONAL, P_EXPECTED_OFFSET, P_EXPECTED_SEQUENCE, P_SEQUENCE, P_ALL };
static const char *produce_names[P_ALL] = {"self", "topic", "value", "key", "partition", "on_delivery",
                                          "timestamp", "headers", "callback", "expected_offset",
                                          "expected_sequence", "sequence"};
static PyObject *produce_name_objects[P_ALL], *str_queue, *str_send_queued, *minus_one, *zero;

static PyObject *delegate(Produce *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(self->full, args, nargsf, kwnames);
}

/* Which produce() parameter a keyword names; -1 if none (then the full path raises the TypeError). */
static int parameter_of(PyObject *name) {
    for (int i = P_TOPIC; i < P_ALL; i++)
        if (name == produce_name_objects[i]) return i;
    for (int i = P_TOPIC; i < P_ALL; i++)
        if (PyUnicode_Compare(name, produce_name_objects[i]) == 0) return i;
    return -1;
}

static PyObject *Produce_call(Produce *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs < 2 || nargs > P_POSITIONAL) return delegate(self, args, nargsf, kwnames);
    PyObject *given[P_ALL] = {NULL};
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        int at = parameter_of(PyTuple_GET_ITEM(kwnames, i));
        if (at < 0 || given[at] != NULL) return delegate(self, args, nargsf, kwnames);
        given[at] = args[nargs + i];
    }
    for (int i = P_HEADERS; i < P_ALL; i++)
        if (given[i] != NULL && given[i] != Py_None && i != P_CALLBACK) return delegate(self, args, nargsf, kwnames);
    PyObject *producer = given[P_SELF];
    PyObject *callback = given[P_CALLBACK] != NULL ? given[P_CALLBACK] : Py_None; /* callback or on_delivery */
    int truth = callback == Py_None ? 0 : PyObject_IsTrue(callback);
    if (truth < 0) return NULL;
    if (!truth) callback = given[P_ON_DELIVERY] != NULL ? given[P_ON_DELIVERY] : Py_None;

    PyObject *queue = PyObject_GetAttr(producer, str_queue);
    if (queue == NULL) return NULL;
    if (!Py_IS_TYPE(queue, &AccumulatorType)) { /* a Python accumulator: the full path does it all */
        Py_DECREF(queue);
        return delegate(self, args, nargsf, kwnames);
    }
    PyObject *fields[6] = {given[P_TOPIC], given[P_VALUE] ? given[P_VALUE] : Py_None,
                           given[P_KEY] ? given[P_KEY] : Py_None, given[P_PARTITION] ? given[P_PARTITION] : minus_one,
                           callback, given[P_TIMESTAMP] ? given[P_TIMESTAMP] : zero};
    PyObject *outcome = locked_add((Accumulator *)queue, fields);
    Py_DECREF(queue);
    if (outcome == NULL) return NULL;
    long queued = PyLong_AsLong(outcome);
    Py_DECREF(outcome);
    if (queued == NOT_QUEUED) return delegate(self, args, nargsf, kwnames);
    if (queued == QUEUED) Py_RETURN_NONE;
    PyObject *code = PyLong_FromLong(queued);
    if (code == NULL) return NULL;
    PyObject *sent = PyObject_CallMethodOneArg(producer, str_send_queued, code);
    Py_DECREF(code);
    if (sent == NULL) return NULL;
    Py_DECREF(sent);
    Py_RETURN_NONE;
}

static PyObject *Produce_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *full;
    static char *names[] = {"full", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Produce", names, &full)) return NULL;
    if (!PyCallable_Check(full)) {
        PyErr_SetString(PyExc_TypeError, "Produce() takes the full produce() path, a callable");
        return NULL;
    }
    Produce *self = (Produce *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->full = Py_NewRef(full);
    self->vectorcall = (vectorcallfunc)Produce_call;
    return (PyObject *)self;
}

static PyObject *Produce_get(PyObject *self, PyObject *instance, PyObject *owner) {
    if (instance == NULL || instance == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, instance);
}

static PyObject *Produce_getattro(Produce *self, PyObject *name) {
    /* __doc__, __name__, __wrapped__ and the rest are the full path's, so that help() and inspect.signature()
       show produce() as written. __call__ is the full path as a bound method's (self already given): the
       signature unittest.mock's autospec reads for a method that is not a Python function, and checks calls with */
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__call__") == 0)
        return PyMethod_New(self->full, Py_None);
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return found;
    PyErr_Clear();
    return PyObject_GetAttr(self->full, name);
}

static int Produce_traverse(Produce *self, visitproc visit, void *arg) {
    Py_VISIT(self->full);
    return 0;
}

static int Produce_clear(Produce *self) {
    Py_CLEAR(self->full);
    return 0;
}

static void Produce_dealloc(Produce *self) {
    PyObject_GC_UnTrack(self);
    Produce_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Produce_doc(Produce *self, void *closure) { return PyObject_GetAttrString(self->full, "__doc__"); }

static PyGetSetDef Produce_getset[] = {
    {"__doc__", (getter)Produce_doc, NULL, NULL, NULL},
    {NULL},
};

static PyMemberDef Produce_members[] = {
    {"__wrapped__", T_OBJECT_EX, offsetof(Produce, full), READONLY, NULL},
    {NULL},
};

static PyTypeObject ProduceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "onceflow.connector._accumulator.Produce",
    .tp_basicsize = sizeof(Produce),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = Produce_tp_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Produce, vectorcall),
    .tp_descr_get = Produce_get,
    .tp_getattro = (getattrofunc)Produce_getattro,
    .tp_traverse = (traverseproc)Produce_traverse,
    .tp_clear = (inquiry)Produce_clear,
    .tp_dealloc = (destructor)Produce_dealloc,
    .tp_members = Produce_members,
    .tp_getset = Produce_getset,
};

/* -- module ------------------------------------------------------------------------------------------------------ */

static PyObject *crc32_py(PyObject *module, PyObject *data) {
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "crc32() takes bytes");
        return NULL;
    }
    return PyLong_FromUnsignedLong(crc32_of((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)));
}

static PyMethodDef methods[] = {
    {"crc32", crc32_py, METH_O, "crc32(data): the hash a key is routed by (zlib.crc32), as computed here"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_accumulator", NULL, -1, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__accumulator(void) {
    crc_init();
    for (int i = 0; i < P_ALL; i++)
        if ((produce_name_objects[i] = PyUnicode_InternFromString(produce_names[i])) == NULL) return NULL;
    if ((str_queue = PyUnicode_InternFromString("_queue")) == NULL ||
        (str_send_queued = PyUnicode_InternFromString("_send_queued")) == NULL ||
        (minus_one = PyLong_FromLong(-1)) == NULL || (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    if (PyType_Ready(&BatchType) < 0 || PyType_Ready(&AccumulatorType) < 0 || PyType_Ready(&ProduceType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Batch", (PyObject *)&BatchType) < 0 ||
        PyModule_AddObjectRef(m, "Accumulator", (PyObject *)&AccumulatorType) < 0 ||
        PyModule_AddObjectRef(m, "Produce", (PyObject *)&ProduceType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
