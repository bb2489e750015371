/* The per-record work of reading Kafka, in C: a fetch split into runs of records of one partition (0.13 us a record
   in Python), and confluent-kafka's records made onceflow's Messages (0.39 us a record in Python, half of what
   confluent-kafka's own consume costs). And of writing it: the delivery callback of each record written.

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
   added come after it). Read only where a record's own getters gave what it holds (layout_agrees), so a version
   that moves a field is asked through the getters, as any other class is: reading the fields costs ~0.03 us a
   record, calling five getters ~0.2 (the timestamp's makes a tuple). */
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

/* confluent-kafka's Message class, its getters, and whether its fields may be read (see KafkaMessage), looked up
   once per call. A record of any other class is asked by name. */
typedef struct {
    PyTypeObject *type;
    PyObject *getters[GETTERS];
    int layout; /* 1: the fields of ``type`` records are read through KafkaMessage */
} Source;

static PyObject *or_none(PyObject *field) { return Py_NewRef(field != NULL ? field : Py_None); }

/* A field read through KafkaMessage, a new reference as its getter gives it; NULL (no exception set) for the
   headers when the record has some (only the getter makes them Python's) and for the timestamp (timestamp_of). */
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
    PyObject *args[1] = {record};
    if (Py_IS_TYPE(record, source->type)) {
        if (source->layout) {
            PyObject *field = read_field((const KafkaMessage *)record, getter);
            if (field != NULL || PyErr_Occurred()) return field;
        }
        return PyObject_Vectorcall(source->getters[getter], args, 1, NULL);
    }
    PyObject *name = PyUnicode_FromString(getter_names[getter]);
    if (name == NULL) return NULL;
    PyObject *out = PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(name);
    return out;
}

/* Whether ``got`` (a getter's result) is the integer ``value``, or None where ``present`` is 0; -1 on error. */
static int same_int(PyObject *got, int present, long long value) {
    if (!present) return got == Py_None;
    if (!PyLong_CheckExact(got)) return 0;
    long long held = PyLong_AsLongLong(got);
    if (held == -1 && PyErr_Occurred()) return -1;
    return held == value;
}

/* Whether ``sample``'s getters give what KafkaMessage says it holds: the same objects (the topic, key, value,
   error, headers), the same numbers. Compares raw fields and never takes a reference to one, so a layout that
   is not this one is only found out, never read. -1 with an exception set. */
static int layout_agrees(const Source *source, PyObject *sample) {
    if (!Py_IS_TYPE(sample, source->type) || source->type->tp_basicsize < (Py_ssize_t)sizeof(KafkaMessage)) return 0;
    PyObject *got[GETTERS] = {NULL};
    int agrees = -1;
    for (int i = 0; i < GETTERS; i++)
        if ((got[i] = get(source, i, sample)) == NULL) goto done;
    const KafkaMessage *m = (const KafkaMessage *)sample; /* after the getters: headers() may have made its field */
    PyObject *pair = got[GET_TIMESTAMP];
    agrees = got[GET_TOPIC] == (m->topic ? m->topic : Py_None) && got[GET_KEY] == (m->key ? m->key : Py_None) &&
             got[GET_VALUE] == (m->value ? m->value : Py_None) && got[GET_ERROR] == (m->error ? m->error : Py_None) &&
             got[GET_HEADERS] == (m->headers ? m->headers : Py_None) && m->c_headers == NULL &&
             PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2;
    int checks[4] = {agrees, 1, 1, 1};
    if (agrees) {
        checks[1] = same_int(got[GET_OFFSET], m->offset >= 0, m->offset);
        checks[2] = same_int(got[GET_PARTITION], m->partition != -1, m->partition);
        int kind = same_int(PyTuple_GET_ITEM(pair, 0), 1, m->tstype);
        checks[3] = kind == 1 ? same_int(PyTuple_GET_ITEM(pair, 1), 1, m->timestamp) : kind;
    }
    agrees = 1;
    for (int i = 0; i < 4; i++) {
        if (checks[i] < 0) agrees = -1;
        else if (agrees == 1 && !checks[i]) agrees = 0;
    }
done:
    for (int i = 0; i < GETTERS; i++) Py_XDECREF(got[i]);
    return agrees;
}

/* The first item of a list, NULL if it is empty (a borrowed reference: the caller holds the list). */
static PyObject *first_of(PyObject *items) { return PyList_GET_SIZE(items) ? PyList_GET_ITEM(items, 0) : NULL; }

static void release(Source *source) {
    for (int i = 0; i < GETTERS; i++) Py_CLEAR(source->getters[i]);
}

/* The getters of ``type``, and whether ``sample`` (a record of the call, or NULL) shows its fields may be read;
   0 with an exception set if a getter is missing. */
static int look_up(Source *source, PyTypeObject *type, PyObject *sample) {
    source->type = type;
    source->layout = 0;
    for (int i = 0; i < GETTERS; i++) source->getters[i] = NULL;
    for (int i = 0; i < GETTERS; i++) {
        source->getters[i] = PyObject_GetAttrString((PyObject *)type, getter_names[i]);
        if (source->getters[i] == NULL) {
            release(source);
            return 0;
        }
    }
    if (sample != NULL) {
        int agrees = layout_agrees(source, sample);
        if (agrees < 0) {
            release(source);
            return 0;
        }
        source->layout = agrees;
    }
    return 1;
}

/* The record's timestamp as onceflow gives it: -1 where Kafka has none (type 0). New reference or NULL. */
static PyObject *timestamp_of(const Source *source, PyObject *record) {
    if (source->layout && Py_IS_TYPE(record, source->type)) {
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
    if (!look_up(&source, (PyTypeObject *)record_type, first_of(records))) return NULL;
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
    if (!look_up(&source, (PyTypeObject *)record_type, first_of(messages))) return NULL;
    Split split = {PyList_New(0), PyList_New(0)};
    PyObject *out = NULL;
    if (split.runs != NULL && split.errors != NULL && for_each(messages, split_one, &split, &source))
        out = PyTuple_Pack(2, split.runs, split.errors);
    release(&source);
    Py_XDECREF(split.runs);
    Py_XDECREF(split.errors);
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
        PyObject *offset = PyObject_VectorcallMethod(str_offset, &args[1], 1, NULL); /* args: ours to read only */
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

/* reads_fields(record_type, sample): whether the conversions read the fields of ``record_type`` records directly
   (see KafkaMessage), by what ``sample`` shows. */
static PyObject *reads_fields(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *record_type, *sample;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &record_type, &sample)) return NULL;
    Source source;
    if (!look_up(&source, (PyTypeObject *)record_type, sample)) return NULL;
    int layout = source.layout;
    release(&source);
    return PyBool_FromLong(layout);
}

static PyMethodDef methods[] = {
    {"reads_fields", reads_fields, METH_VARARGS, "Whether the conversions read a record class's fields directly."},
    {"as_messages", as_messages, METH_VARARGS, "confluent-kafka records as Messages, or None: see messages.py."},
    {"in_runs", in_runs, METH_VARARGS, "A fetch's records in runs of one partition, and its errors: see messages.py."},
    KEEP_COLLECTABLE_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_messages", NULL, -1, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__messages(void) {
    if ((str_offset = PyUnicode_InternFromString("offset")) == NULL || PyType_Ready(&ReporterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Reporter", (PyObject *)&ReporterType) < 0) Py_CLEAR(m);
    return m;
}
