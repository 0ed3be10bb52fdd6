"""What the packaging tests share: a PATH without some programs."""

import os
import shutil

import pytest


@pytest.fixture
def path_without(tmp_path):
    """path_without(*prefixes): a PATH of one folder that links every program of this PATH
    but those whose names start with one of the prefixes (the rest, compilers and make
    included, stay: they may share a folder with what is left out, as /usr/bin does)."""

    def make(*prefixes):
        tools = tmp_path / ("without-" + "-".join(prefixes))
        tools.mkdir()
        for folder in os.environ.get("PATH", "").split(os.pathsep):
            if not os.path.isdir(folder):
                continue
            for name in os.listdir(folder):
                target = os.path.join(folder, name)
                if name.startswith(prefixes) or (tools / name).exists():
                    continue
                if os.path.isfile(target) and os.access(target, os.X_OK):
                    os.symlink(target, tools / name)
        for prefix in prefixes:
            assert shutil.which(prefix, path=str(tools)) is None, prefix
        return str(tools)

    return make
