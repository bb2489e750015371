"""The one C extension, the stored batch format's common case (connector/store/_batch_codec.c); everything else
is in pyproject.toml. Optional: where no C compiler is found the install still succeeds, and
connector/store/batch_codec.py does all the work."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("onceflow.connector.store._batch_codec", ["connector/store/_batch_codec.c"],
                             optional=True)])
