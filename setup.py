"""The C extensions, three hot paths; everything else is in pyproject.toml. Optional: where no C compiler is found
the install still succeeds, and Python does all the work:
- the stored batch format's common case (connector/store/_batch_codec.c; else connector/store/batch_codec.py);
- a Producer's per-record work (connector/_accumulator.c; else connector/accumulator.py);
- confluent-kafka's records as Messages (connector/store/kafka/_messages.c; else connector/store/kafka/messages.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("onceflow.connector._accumulator", ["connector/_accumulator.c"], optional=True),
    Extension("onceflow.connector.store._batch_codec", ["connector/store/_batch_codec.c"], optional=True,
              depends=["connector/_message_slots.h"]),
    Extension("onceflow.connector.store.kafka._messages", ["connector/store/kafka/_messages.c"], optional=True,
              depends=["connector/_message_slots.h"]),
])
