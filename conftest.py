"""Root conftest of a diag checkout: registers the diag pytest plugin when the package is not
installed (an installed diag registers it through its `pytest11` entry point, named "diag").

Registering the same module twice makes pytest fail ("Plugin already registered under a
different name"), so the registration asks pytest's plugin manager first instead of listing
the module in `pytest_plugins` unconditionally. `pytest_addoption` is a historic hook: a
plugin registered while it runs still gets its own options, configure and fixtures.
`-p no:diag` is honoured (a blocked name is not registered).
"""

import importlib

PLUGIN = "diag.pytest_plugin"


def pytest_addoption(parser, pluginmanager):
    module = importlib.import_module(PLUGIN)
    if not pluginmanager.is_registered(module) and not pluginmanager.is_blocked("diag"):
        pluginmanager.register(module, "diag")
