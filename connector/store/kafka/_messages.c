/* The per-record work of reading Kafka, in C: a fetch split into runs of records of one partition (0.13 us a record
   in Python), and confluent-kafka's records made onceflow's Messages (0.39 us a record in Python, half of what
   confluent-kafka's own consume costs).

   messages.py stays the reference and the fallback: this returns None where it cannot set a Message's fields
   directly (a Message class whose fields are not plain slots), and Python then does the work. The fields are set
   through the slots' own offsets, read from the class's member descriptors, so the layout is the class's own. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define FIELDS 8
static const char *field_names[FIELDS] = {"_topic", "_partition", "_offset", "_key", "_value", "_headers",
                                          "_timestamp", "_error"};
enum { TOPIC, PARTITION, OFFSET, KEY, VALUE, HEADERS, TIMESTAMP, ERROR };

enum { GET_OFFSET, GET_KEY, GET_VALUE, GET_TIMESTAMP, GET_HEADERS, GET_ERROR, GET_TOPIC, GET_PARTITION, GETTERS };
static const char *getter_names[GETTERS] = {"offset", "key", "value", "timestamp", "headers", "error", "topic",
                                            "partition"};

/* confluent-kafka's Message class and its getters, looked up once per call: calling a getter directly, rather
   than looking the method up on each record, halves the cost. A record of any other class is asked by name. */
typedef struct {
    PyTypeObject *type;
    PyObject *getters[GETTERS];
} Source;

/* Each field's offset in an instance of the class; 0 if one is not a plain object slot (an exception set only
   if looking failed for another reason). */
static int field_offsets(PyTypeObject *type, Py_ssize_t offsets[FIELDS]) {
    for (int i = 0; i < FIELDS; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, field_names[i]);
        if (descr == NULL) {
            PyErr_Clear();
            return 0;
        }
        int plain = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                    ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        offsets[i] = plain ? ((PyMemberDescrObject *)descr)->d_member->offset : 0;
        Py_DECREF(descr);
        if (!plain) return 0;
    }
    return 1;
}

static PyObject *get(const Source *source, int getter, PyObject *record) {
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
    for (int i = 0; i < GETTERS; i++) {
        source->getters[i] = PyObject_GetAttrString((PyObject *)type, getter_names[i]);
        if (source->getters[i] == NULL) {
            release(source);
            return 0;
        }
    }
    return 1;
}

/* The record's timestamp as onceflow gives it: -1 where Kafka has none (type 0). New reference or NULL. */
static PyObject *timestamp_of(const Source *source, PyObject *record) {
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
                            const Py_ssize_t offsets[FIELDS], PyObject *stream, PyObject *partition,
                            PyObject *headers_of) {
    PyObject *fields[FIELDS] = {Py_NewRef(stream), Py_NewRef(partition), NULL, NULL, NULL, NULL, NULL,
                                Py_NewRef(Py_None)};
    PyObject *message = NULL;
    if ((fields[OFFSET] = get(source, GET_OFFSET, record)) == NULL ||
        (fields[KEY] = get(source, GET_KEY, record)) == NULL ||
        (fields[VALUE] = get(source, GET_VALUE, record)) == NULL ||
        (fields[HEADERS] = headers_of_record(source, record, headers_of)) == NULL ||
        (fields[TIMESTAMP] = timestamp_of(source, record)) == NULL ||
        (message = type->tp_alloc(type, 0)) == NULL)
        goto done;
    for (int i = 0; i < FIELDS; i++) {
        *(PyObject **)((char *)message + offsets[i]) = fields[i];
        fields[i] = NULL; /* the message holds it now */
    }
done:
    for (int i = 0; i < FIELDS; i++) Py_XDECREF(fields[i]);
    return message;
}

static PyObject *as_messages(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *records, *stream, *partition, *headers_of;
    PyTypeObject *type, *record_type;
    if (!PyArg_ParseTuple(args, "O!UO!O!O!O", &PyList_Type, &records, &stream, &PyLong_Type, &partition,
                          &PyType_Type, &type, &PyType_Type, &record_type, &headers_of))
        return NULL;
    Py_ssize_t offsets[FIELDS];
    if (!field_offsets(type, offsets)) Py_RETURN_NONE;
    Source source;
    if (!look_up(&source, record_type)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        PyObject *message = message_of(&source, PyList_GET_ITEM(records, i), type, offsets, stream, partition,
                                       headers_of);
        if (message == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, message);
    }
    release(&source);
    return out;
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

static PyObject *in_runs(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *messages;
    PyTypeObject *record_type;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &messages, &PyType_Type, &record_type)) return NULL;
    Source source;
    if (!look_up(&source, record_type)) return NULL;
    PyObject *runs = PyList_New(0), *errors = PyList_New(0), *out = NULL;
    for (Py_ssize_t i = 0; runs != NULL && errors != NULL && i < PyList_GET_SIZE(messages); i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        PyObject *error = get(&source, GET_ERROR, message);
        int ok = error != NULL;
        if (ok && error == Py_None) {
            ok = add_to_runs(&source, runs, message);
        } else if (ok) {
            PyObject *pair = PyTuple_Pack(2, message, error);
            ok = pair != NULL && PyList_Append(errors, pair) == 0;
            Py_XDECREF(pair);
        }
        Py_XDECREF(error);
        if (!ok) goto done;
    }
    if (runs != NULL && errors != NULL) out = PyTuple_Pack(2, runs, errors);
done:
    release(&source);
    Py_XDECREF(runs);
    Py_XDECREF(errors);
    return out;
}

static PyMethodDef methods[] = {
    {"as_messages", as_messages, METH_VARARGS, "confluent-kafka records as Messages, or None: see messages.py."},
    {"in_runs", in_runs, METH_VARARGS, "A fetch's records in runs of one partition, and its errors: see messages.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_messages", NULL, -1, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__messages(void) { return PyModule_Create(&module); }
