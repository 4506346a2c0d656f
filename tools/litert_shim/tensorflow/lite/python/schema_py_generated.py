from ai_edge_litert.schema_py_generated import *  # noqa: F403  (litert-torch shim, see tools/README.md)
