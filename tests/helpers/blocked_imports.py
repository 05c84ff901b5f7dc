"""A child process that cannot import a package: a ``sitecustomize`` on its PYTHONPATH puts a finder
first on ``sys.meta_path`` that raises ModuleNotFoundError for the package, as a machine without it
would (the package stays installed for the test process itself)."""

import os

from tests.conftest import RANK_VARS, ROOT

_BLOCKER = '''
import sys


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {package!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
'''


def env_without(package: str, folder) -> dict:
    """os.environ for a child that cannot import ``package`` (its sitecustomize written into
    ``folder``), without the launcher's rank variables, bert_of importable from ROOT."""
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(_BLOCKER.format(package=package))
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), ROOT])
    return env
