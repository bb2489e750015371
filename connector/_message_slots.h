/* onceflow's Message made in C, by the hot paths that make one per record read (connector/store/_batch_codec.c for
   the embedded store, connector/store/kafka/_messages.c for Kafka). Its fields are set through the slots' own
   offsets, read from the class's member descriptors, so the layout is the class's own; a class whose fields are
   not plain slots (a subclass that changed them) is left to Python. Include after Python.h and structmember.h. */

#define MESSAGE_FIELDS 8
enum { M_TOPIC, M_PARTITION, M_OFFSET, M_KEY, M_VALUE, M_HEADERS, M_TIMESTAMP, M_ERROR };
static const char *message_field_names[MESSAGE_FIELDS] = {"_topic", "_partition", "_offset", "_key", "_value",
                                                          "_headers", "_timestamp", "_error"};

/* Each field's offset in an instance of ``type``; 0 (no exception set) if one is not a plain object slot of the
   class or of a base of it. */
static int message_slots(PyTypeObject *type, Py_ssize_t offsets[MESSAGE_FIELDS]) {
    for (int i = 0; i < MESSAGE_FIELDS; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)type, message_field_names[i]);
        if (descr == NULL) {
            PyErr_Clear();
            return 0;
        }
        int plain = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                    ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX &&
                    PyType_IsSubtype(type, PyDescr_TYPE(descr));
        offsets[i] = plain ? ((PyMemberDescrObject *)descr)->d_member->offset : 0;
        Py_DECREF(descr);
        if (!plain) return 0;
    }
    return 1;
}

/* Whether the collector may ever track ``field``: CPython's own rule (_PyObject_GC_MAY_BE_TRACKED). An untracked
   dict is tracked once it is given a container; only an untracked exact tuple never is. */
static int may_be_tracked(PyObject *field) {
    if (!PyObject_IS_GC(field)) return 0;
    return PyTuple_CheckExact(field) ? PyObject_GC_IsTracked(field) : 1;
}

/* 1 if no reference cycle can pass through a ``type`` instance holding ``fields``: none of them may ever be
   tracked by the garbage collector (str, int, bytes, None: a record read without headers), and the class has no
   other field that could later be given one (no __dict__, no slot but the eight). 0 if one could. */
static int message_acyclic(PyTypeObject *type, PyObject *fields[MESSAGE_FIELDS]) {
#ifdef Py_TPFLAGS_MANAGED_DICT
    if (type->tp_flags & Py_TPFLAGS_MANAGED_DICT) return 0;
#endif
    if (type->tp_dictoffset != 0 ||
        type->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + MESSAGE_FIELDS * sizeof(PyObject *)))
        return 0;
    for (int i = 0; i < MESSAGE_FIELDS; i++)
        if (may_be_tracked(fields[i])) return 0;
    return 1;
}

/* A new ``type`` instance holding ``fields`` (each a new reference, all taken, whatever the outcome; none NULL);
   NULL with an exception set.

   Left untracked by the garbage collector where no cycle can pass through it (message_acyclic): a read of 10,000
   records keeps them alive through dozens of collections, which cost ~0.5 us a record. Message's setters track it
   again when they give it a field the collector may track (connector/message.py, through keep_collectable()). */
static PyObject *new_message(PyTypeObject *type, const Py_ssize_t offsets[MESSAGE_FIELDS],
                             PyObject *fields[MESSAGE_FIELDS]) {
    PyObject *message = type->tp_alloc(type, 0);
    if (message != NULL && message_acyclic(type, fields)) PyObject_GC_UnTrack(message);
    for (int i = 0; i < MESSAGE_FIELDS; i++) {
        if (message != NULL)
            *(PyObject **)((char *)message + offsets[i]) = fields[i]; /* the message holds it now */
        else
            Py_DECREF(fields[i]);
        fields[i] = NULL;
    }
    return message;
}

/* keep_collectable(message, field): the garbage collector tracks a Message that new_message left untracked once
   it is given a field the collector may ever track (Message's setters call it): a cycle through it is then
   collected as any other. */
static PyObject *keep_collectable(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyObject_IS_GC(args[0])) {
        PyErr_SetString(PyExc_TypeError, "keep_collectable(message, field) takes a Message and its new field");
        return NULL;
    }
    if (!PyObject_GC_IsTracked(args[0]) && may_be_tracked(args[1])) PyObject_GC_Track(args[0]);
    Py_RETURN_NONE;
}

#define KEEP_COLLECTABLE_METHOD                                                                                     \
    {"keep_collectable", (PyCFunction)(void (*)(void))keep_collectable, METH_FASTCALL,                              \
     "The collector tracks a Message made here once given a field it may track: see _message_slots.h."}
