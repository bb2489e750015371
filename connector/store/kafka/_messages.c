/* The per-record work of reading Kafka, in C: a fetch split into runs of records of one partition (0.13 us a record
   in Python), and confluent-kafka's records made onceflow's Messages (0.39 us a record in Python, half of what
   confluent-kafka's own consume costs). And of writing it: each record handed to confluent-kafka's produce (0.33 us
   a record of Python loop), and the delivery callback of each record written.

   messages.py stays the reference and the fallback: this returns None where it cannot set a Message's fields
   directly (a Message class whose fields are not plain slots: see _message_slots.h), and Python then does the
   work. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "../../_message_slots.h"

enum { GET_OFFSET, GET_KEY, GET_VALUE, GET_TIMESTAMP, GET_HEADERS, GET_ERROR, GET_TOPIC, GET_PARTITION, GETTERS };
static const char *getter_names[GETTERS] = {"offset", "key", "value", "timestamp", "headers", "error", "topic",
                                            "partition"};

/* confluent-kafka's Message as its confluent_kafka.h lays it out, up to the last field read here (the fields since
   added come after it). Read only for the class read_fields_of accepted, so a release that moves a field is asked
   through the getters, as any other class is: reading the fields costs ~0.03 us a record, calling five getters
   ~0.2 (the timestamp's makes a tuple). With the GIL nothing runs between reading a field and taking a reference
   to it; a free-threaded build would race confluent-kafka's setters here (its getters lock the record). */
typedef struct {
    PyObject_HEAD
    PyObject *topic, *value, *key, *headers; /* NULL: None */
    void *c_headers;                         /* librdkafka's headers, made ``headers`` by the getter's first call */
    PyObject *error;
    int32_t partition; /* -1: None */
    int64_t offset;    /* < 0: None */
    int32_t leader_epoch;
    int64_t timestamp;
    int tstype; /* rd_kafka_timestamp_type_t: 0 when the record has no timestamp */
} KafkaMessage;

/* The class whose records' fields are read through KafkaMessage (NULL: none), set by read_fields_of. */
static PyTypeObject *readable = NULL;

static int reads_fields(PyObject *record) { return readable != NULL && Py_IS_TYPE(record, readable); }

/* confluent-kafka's Message class and its getters, looked up once per call. A record of any other class is asked
   by name. */
typedef struct {
    PyTypeObject *type;
    PyObject *getters[GETTERS];
} Source;

static PyObject *or_none(PyObject *field) { return Py_NewRef(field != NULL ? field : Py_None); }

/* A field of a record of the ``readable`` class, a new reference as its getter gives it; NULL (no exception set)
   for the headers when the record has some (only the getter makes them Python's) and for the timestamp
   (timestamp_of). */
static PyObject *read_field(const KafkaMessage *m, int getter) {
    switch (getter) {
    case GET_OFFSET: return m->offset >= 0 ? PyLong_FromLongLong(m->offset) : Py_NewRef(Py_None);
    case GET_KEY: return or_none(m->key);
    case GET_VALUE: return or_none(m->value);
    case GET_ERROR: return or_none(m->error);
    case GET_TOPIC: return or_none(m->topic);
    case GET_PARTITION: return m->partition != -1 ? PyLong_FromLong(m->partition) : Py_NewRef(Py_None);
    case GET_HEADERS: return m->headers == NULL && m->c_headers == NULL ? Py_NewRef(Py_None) : NULL;
    default: return NULL;
    }
}

static PyObject *get(const Source *source, int getter, PyObject *record) {
    if (reads_fields(record)) {
        PyObject *field = read_field((const KafkaMessage *)record, getter);
        if (field != NULL || PyErr_Occurred()) return field;
    }
    PyObject *args[1] = {record};
    if (Py_IS_TYPE(record, source->type)) return PyObject_Vectorcall(source->getters[getter], args, 1, NULL);
    PyObject *name = PyUnicode_FromString(getter_names[getter]);
    if (name == NULL) return NULL;
    PyObject *out = PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(name);
    return out;
}

static void release(Source *source) {
    for (int i = 0; i < GETTERS; i++) Py_CLEAR(source->getters[i]);
}

/* 0 with an exception set if a getter is missing. */
static int look_up(Source *source, PyTypeObject *type) {
    source->type = type;
    for (int i = 0; i < GETTERS; i++) source->getters[i] = NULL;
    for (int i = 0; i < GETTERS; i++) {
        source->getters[i] = PyObject_GetAttrString((PyObject *)type, getter_names[i]);
        if (source->getters[i] == NULL) {
            release(source);
            return 0;
        }
    }
    return 1;
}

/* Whether ``got`` (a getter's result) is the nonzero integer ``value``. */
static int is_int(PyObject *got, long long value) {
    if (value == 0 || !PyLong_CheckExact(got)) return 0;
    int overflow;
    return PyLong_AsLongLongAndOverflow(got, &overflow) == value && !overflow;
}

/* Whether the getters of ``type`` read its instances' fields as KafkaMessage lays them out, by what they give for
   ``probe``: each a C method of ``type`` itself taking no arguments (so it gives what the record holds, and no
   Python code runs), and ``probe``'s every field set and told apart from the others (five distinct objects, three
   distinct numbers), so a field in any other place would be found out. Raw fields are compared, never read
   through. -1 with an exception set. */
static int layout_agrees(PyTypeObject *type, PyObject *probe) {
    if (!Py_IS_TYPE(probe, type) || type->tp_basicsize < (Py_ssize_t)sizeof(KafkaMessage)) return 0;
    Source source;
    if (!look_up(&source, type)) return -1;
    PyObject *got[GETTERS] = {NULL};
    int agrees = 0;
    for (int i = 0; i < GETTERS; i++) {
        PyObject *getter = source.getters[i];
        if (!Py_IS_TYPE(getter, &PyMethodDescr_Type) || PyDescr_TYPE(getter) != type ||
            ((PyMethodDescrObject *)getter)->d_method->ml_flags != METH_NOARGS)
            goto done;
    }
    agrees = -1;
    for (int i = 0; i < GETTERS; i++) /* the descriptors themselves: get() would read the fields once accepted */
        if ((got[i] = PyObject_CallOneArg(source.getters[i], probe)) == NULL) goto done;
    const KafkaMessage *m = (const KafkaMessage *)probe; /* after the getters: headers() may have made its field */
    PyObject *objects[5] = {m->topic, m->key, m->value, m->headers, m->error};
    int distinct = 1;
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++) distinct = distinct && objects[i] != objects[j];
    for (int i = 0; i < 5; i++) distinct = distinct && objects[i] != NULL && objects[i] != Py_None;
    PyObject *pair = got[GET_TIMESTAMP];
    agrees = distinct && m->c_headers == NULL && got[GET_TOPIC] == m->topic && got[GET_KEY] == m->key &&
             got[GET_VALUE] == m->value && got[GET_HEADERS] == m->headers && got[GET_ERROR] == m->error &&
             m->partition != m->offset && m->offset != m->timestamp && m->partition != m->timestamp &&
             is_int(got[GET_PARTITION], m->partition) && is_int(got[GET_OFFSET], m->offset) &&
             PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 && is_int(PyTuple_GET_ITEM(pair, 0), m->tstype) &&
             is_int(PyTuple_GET_ITEM(pair, 1), m->timestamp);
done:
    for (int i = 0; i < GETTERS; i++) Py_XDECREF(got[i]);
    release(&source);
    return agrees;
}

/* read_fields_of(record_type, probe): see messages.py. */
static PyObject *read_fields_of(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *type, *probe;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &probe)) return NULL;
    int agrees = layout_agrees((PyTypeObject *)type, probe);
    if (agrees < 0) return NULL;
    if (agrees) Py_XSETREF(readable, (PyTypeObject *)Py_NewRef(type));
    return PyBool_FromLong(agrees);
}

/* The record's timestamp as onceflow gives it: -1 where Kafka has none (type 0). New reference or NULL. */
static PyObject *timestamp_of(const Source *source, PyObject *record) {
    if (reads_fields(record)) {
        const KafkaMessage *m = (const KafkaMessage *)record;
        return m->tstype ? PyLong_FromLongLong(m->timestamp) : PyLong_FromLong(-1);
    }
    PyObject *pair = get(source, GET_TIMESTAMP, record);
    if (pair == NULL) return NULL;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "a confluent-kafka timestamp that is not a (type, value) pair");
        return NULL;
    }
    int kind = PyObject_IsTrue(PyTuple_GET_ITEM(pair, 0));
    PyObject *out = kind < 0 ? NULL : kind ? Py_NewRef(PyTuple_GET_ITEM(pair, 1)) : PyLong_FromLong(-1);
    Py_DECREF(pair);
    return out;
}

/* The record's headers through ``headers_of`` (onceflow's own hidden), None for none. New reference or NULL. */
static PyObject *headers_of_record(const Source *source, PyObject *record, PyObject *headers_of) {
    PyObject *headers = get(source, GET_HEADERS, record);
    if (headers == NULL) return NULL;
    int some = PyObject_IsTrue(headers);
    PyObject *out = some < 0 ? NULL : some ? PyObject_CallOneArg(headers_of, headers) : Py_NewRef(Py_None);
    Py_DECREF(headers);
    return out;
}

/* One Message of the stream's partition for one confluent-kafka record; NULL with an exception set. */
static PyObject *message_of(const Source *source, PyObject *record, PyTypeObject *type,
                            const Py_ssize_t offsets[MESSAGE_FIELDS], PyObject *stream, PyObject *partition,
                            PyObject *headers_of) {
    PyObject *fields[MESSAGE_FIELDS] = {Py_NewRef(stream), Py_NewRef(partition), NULL, NULL, NULL, NULL, NULL,
                                        Py_NewRef(Py_None)};
    if ((fields[M_OFFSET] = get(source, GET_OFFSET, record)) != NULL &&
        (fields[M_KEY] = get(source, GET_KEY, record)) != NULL &&
        (fields[M_VALUE] = get(source, GET_VALUE, record)) != NULL &&
        (fields[M_HEADERS] = headers_of_record(source, record, headers_of)) != NULL &&
        (fields[M_TIMESTAMP] = timestamp_of(source, record)) != NULL)
        return new_message(type, offsets, fields);
    for (int i = 0; i < MESSAGE_FIELDS; i++) Py_XDECREF(fields[i]);
    return NULL;
}

/* Calls ``each`` on every item of ``items`` (a list: its length read at each step, each item held while it runs,
   since a record's getters may be Python code), with ``out`` and the lookups; 0 with an exception set. */
static int for_each(PyObject *items, int (*each)(void *, const Source *, PyObject *), void *out,
                    const Source *source) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = Py_NewRef(PyList_GET_ITEM(items, i));
        int ok = each(out, source, item);
        Py_DECREF(item);
        if (!ok) return 0;
    }
    return 1;
}

typedef struct {
    PyObject *out, *stream, *partition, *headers_of;
    PyTypeObject *type;
    Py_ssize_t offsets[MESSAGE_FIELDS];
} Conversion;

static int convert_one(void *state, const Source *source, PyObject *record) {
    Conversion *conversion = state;
    PyObject *message = message_of(source, record, conversion->type, conversion->offsets, conversion->stream,
                                   conversion->partition, conversion->headers_of);
    if (message == NULL) return 0;
    int ok = PyList_Append(conversion->out, message) == 0; /* appended: never a list with empty items */
    Py_DECREF(message);
    return ok;
}

static PyObject *as_messages(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *records, *record_type;
    Conversion conversion;
    if (!PyArg_ParseTuple(args, "OOOOOO", &records, &conversion.stream, &conversion.partition, &conversion.type,
                          &record_type, &conversion.headers_of))
        return NULL;
    if (!PyList_CheckExact(records) || !PyUnicode_CheckExact(conversion.stream) ||
        !PyLong_CheckExact(conversion.partition) || !PyType_Check(conversion.type) || !PyType_Check(record_type) ||
        !message_slots((PyTypeObject *)conversion.type, conversion.offsets))
        Py_RETURN_NONE; /* anything else is Python's to convert */
    Source source;
    if (!look_up(&source, (PyTypeObject *)record_type)) return NULL;
    conversion.out = PyList_New(0);
    if (conversion.out != NULL && !for_each(records, convert_one, &conversion, &source)) Py_CLEAR(conversion.out);
    release(&source);
    return conversion.out;
}

/* Adds ``record`` to the last run if it is of the same partition, else starts a run; 0 with an exception set. */
static int add_to_runs(const Source *source, PyObject *runs, PyObject *record) {
    PyObject *topic = get(source, GET_TOPIC, record);
    if (topic == NULL) return 0;
    PyObject *partition = get(source, GET_PARTITION, record);
    if (partition == NULL) {
        Py_DECREF(topic);
        return 0;
    }
    Py_ssize_t count = PyList_GET_SIZE(runs);
    int same = 0;
    if (count) {
        PyObject *key = PyTuple_GET_ITEM(PyList_GET_ITEM(runs, count - 1), 0);
        same = PyObject_RichCompareBool(PyTuple_GET_ITEM(key, 1), partition, Py_EQ);
        if (same == 1) same = PyObject_RichCompareBool(PyTuple_GET_ITEM(key, 0), topic, Py_EQ);
    }
    int ok = same >= 0;
    if (ok && same) {
        ok = PyList_Append(PyTuple_GET_ITEM(PyList_GET_ITEM(runs, count - 1), 1), record) == 0;
    } else if (ok) {
        PyObject *run = Py_BuildValue("((OO)[O])", topic, partition, record);
        ok = run != NULL && PyList_Append(runs, run) == 0;
        Py_XDECREF(run);
    }
    Py_DECREF(topic);
    Py_DECREF(partition);
    return ok;
}

typedef struct {
    PyObject *runs, *errors;
} Split;

static int split_one(void *state, const Source *source, PyObject *message) {
    Split *split = state;
    PyObject *error = get(source, GET_ERROR, message);
    if (error == NULL) return 0;
    int ok;
    if (error == Py_None) {
        /* confluent-kafka's record is read, converted and dropped, never handed out: the collector need not
           track it meanwhile. A fetch's 10,000 records were carried through collections beside the Messages made
           of them: collections took ~0.5 us a record read, ~0.13 less now. */
        if (Py_IS_TYPE(message, source->type) && PyObject_GC_IsTracked(message)) PyObject_GC_UnTrack(message);
        ok = add_to_runs(source, split->runs, message);
    } else {
        PyObject *pair = PyTuple_Pack(2, message, error);
        ok = pair != NULL && PyList_Append(split->errors, pair) == 0;
        Py_XDECREF(pair);
    }
    Py_DECREF(error);
    return ok;
}

static PyObject *in_runs(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *messages, *record_type;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &messages, &PyType_Type, &record_type)) return NULL;
    Source source;
    if (!look_up(&source, (PyTypeObject *)record_type)) return NULL;
    Split split = {PyList_New(0), PyList_New(0)};
    PyObject *out = NULL;
    if (split.runs != NULL && split.errors != NULL && for_each(messages, split_one, &split, &source))
        out = PyTuple_Pack(2, split.runs, split.errors);
    release(&source);
    Py_XDECREF(split.runs);
    Py_XDECREF(split.errors);
    return out;
}

/* -- send: messages.send, a batch's records handed to confluent-kafka's produce, one call a record ------------- */

static PyObject *zero;

/* One record (key, value, headers, timestamp) to produce(), in its positional order (topic, value, key, partition,
   on_delivery, callback, timestamp, headers). -1 and an exception set when it was refused. A record that is not a
   tuple is copied into one first: its fields are then held, whatever Python code runs meanwhile. */
static int send_one(PyObject *produce, PyObject *topic, PyObject *partition, PyObject *record, PyObject *report) {
    PyObject *fields = PyTuple_CheckExact(record) ? Py_NewRef(record) : PySequence_Tuple(record);
    if (fields == NULL) return -1;
    if (PyTuple_GET_SIZE(fields) != 4) {
        PyErr_Format(PyExc_ValueError, "a record is (key, value, headers, timestamp), got %zd fields",
                     PyTuple_GET_SIZE(fields));
        Py_DECREF(fields);
        return -1;
    }
    PyObject *key = PyTuple_GET_ITEM(fields, 0), *value = PyTuple_GET_ITEM(fields, 1),
             *given = PyTuple_GET_ITEM(fields, 2), *timestamp = PyTuple_GET_ITEM(fields, 3);
    int stamped = PyObject_RichCompareBool(timestamp, zero, Py_GT);
    int has_headers = stamped < 0 ? -1 : PyObject_IsTrue(given);
    PyObject *headers = has_headers < 0         ? NULL
                        : !has_headers          ? Py_NewRef(Py_None)
                        : PyList_CheckExact(given) ? Py_NewRef(given)
                                                : PySequence_List(given);
    PyObject *produced = NULL;
    if (headers != NULL) {
        PyObject *argv[8] = {topic, value, key, partition, report, Py_None, stamped ? timestamp : zero, headers};
        produced = PyObject_Vectorcall(produce, argv, 8, NULL);
        Py_DECREF(headers);
    }
    Py_DECREF(fields);
    if (produced == NULL) return -1;
    Py_DECREF(produced);
    return 0;
}

static PyObject *send(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *produce, *topic, *partition, *records, *report;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "OOOOOn:send", &produce, &topic, &partition, &records, &report, &index)) return NULL;
    PyObject *all = PySequence_Fast(records, "records must be a sequence");
    if (all == NULL) return NULL;
    /* The size read again each time: produce() may run Python code (a test's, or a partitioner) that changes it. */
    for (index = index < 0 ? 0 : index; index < PySequence_Fast_GET_SIZE(all); index++) {
        PyObject *record = Py_NewRef(PySequence_Fast_GET_ITEM(all, index));
        int refused = send_one(produce, topic, partition, record, report);
        Py_DECREF(record);
        if (refused) break;
    }
    Py_ssize_t size = PySequence_Fast_GET_SIZE(all);
    Py_DECREF(all);
    if (index >= size) return Py_BuildValue("(nO)", size, Py_None);
    /* Any exception, KeyboardInterrupt too: the caller must learn how many records went out before it. */
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    PyErr_NormalizeException(&type, &error, &traceback);
    if (traceback != NULL) PyException_SetTraceback(error, traceback);
    PyObject *out = Py_BuildValue("(nO)", index, error);
    Py_XDECREF(type);
    Py_XDECREF(error);
    Py_XDECREF(traceback);
    return out;
}

/* -- Reporter: messages.Reporter, a delivery callback called once per record written --------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *landed, *errors, *error_of; /* list of offsets, list of errors, error_of(err, msg) */
    Py_ssize_t reported;
    vectorcallfunc vectorcall;
} Reporter;

static PyObject *str_offset;

static PyObject *Reporter_call(Reporter *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Reporter takes (err, msg)");
        return NULL;
    }
    self->reported += 1;
    PyObject *err = args[0], *msg = args[1];
    if (err == Py_None) {
        /* args: ours to read only. The offset read from the record where its class's fields are (see
           KafkaMessage): 0.015 us a record less than the method's look-up and call. */
        PyObject *offset = reads_fields(msg) ? read_field((const KafkaMessage *)msg, GET_OFFSET)
                                             : PyObject_VectorcallMethod(str_offset, &args[1], 1, NULL);
        if (offset == NULL) return NULL;
        int landed = offset != Py_None;
        int failed = landed && PyList_Append(self->landed, offset) < 0;
        Py_DECREF(offset);
        if (failed) return NULL;
        if (landed) Py_RETURN_NONE;
    }
    PyObject *error = PyObject_CallFunctionObjArgs(self->error_of, err, msg, NULL);
    if (error == NULL) return NULL;
    int failed = error != Py_None && PyList_Append(self->errors, error) < 0;
    Py_DECREF(error);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Reporter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *landed, *errors, *error_of;
    static char *names[] = {"landed", "errors", "error_of", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O:Reporter", names, &PyList_Type, &landed, &PyList_Type,
                                     &errors, &error_of))
        return NULL;
    Reporter *self = (Reporter *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->landed = Py_NewRef(landed);
    self->errors = Py_NewRef(errors);
    self->error_of = Py_NewRef(error_of);
    self->vectorcall = (vectorcallfunc)Reporter_call;
    return (PyObject *)self;
}

static int Reporter_traverse(Reporter *self, visitproc visit, void *arg) {
    Py_VISIT(self->landed);
    Py_VISIT(self->errors);
    Py_VISIT(self->error_of);
    return 0;
}

static int Reporter_clear(Reporter *self) {
    Py_CLEAR(self->landed);
    Py_CLEAR(self->errors);
    Py_CLEAR(self->error_of);
    return 0;
}

static void Reporter_dealloc(Reporter *self) {
    PyObject_GC_UnTrack(self);
    Reporter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Reporter_members[] = {
    {"landed", T_OBJECT_EX, offsetof(Reporter, landed), READONLY, NULL},
    {"errors", T_OBJECT_EX, offsetof(Reporter, errors), READONLY, NULL},
    {"reported", T_PYSSIZET, offsetof(Reporter, reported), READONLY, NULL},
    {NULL},
};

static PyTypeObject ReporterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "onceflow.connector.store.kafka._messages.Reporter",
    .tp_doc = "A delivery callback for one batch's records (messages.Reporter).",
    .tp_basicsize = sizeof(Reporter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Reporter_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Reporter, vectorcall),
    .tp_traverse = (traverseproc)Reporter_traverse,
    .tp_clear = (inquiry)Reporter_clear,
    .tp_dealloc = (destructor)Reporter_dealloc,
    .tp_members = Reporter_members,
};

static PyMethodDef methods[] = {
    {"read_fields_of", read_fields_of, METH_VARARGS, "Read a record class's fields directly, if a probe shows how."},
    {"as_messages", as_messages, METH_VARARGS, "confluent-kafka records as Messages, or None: see messages.py."},
    {"in_runs", in_runs, METH_VARARGS, "A fetch's records in runs of one partition, and its errors: see messages.py."},
    {"send", send, METH_VARARGS, "A batch's records to confluent-kafka's produce until one is refused: see messages.py."},
    KEEP_COLLECTABLE_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_messages", NULL, -1, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__messages(void) {
    if ((str_offset = PyUnicode_InternFromString("offset")) == NULL || (zero = PyLong_FromLong(0)) == NULL ||
        PyType_Ready(&ReporterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Reporter", (PyObject *)&ReporterType) < 0) Py_CLEAR(m);
    return m;
}
