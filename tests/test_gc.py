"""clorch._gc: a large import runs with the collector paused, and what it made is frozen after."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# In a fresh interpreter: freezing is for the whole process, and the test's own has torch already.
PROBE = textwrap.dedent(
    """
    import gc, json, sys
    from clorch._gc import import_long_lived

    full = []
    gc.callbacks.append(lambda phase, info: phase == "start" and info["generation"] == 2 and full.append(1))
    if sys.argv[1] == "off":
        gc.disable()
    module = import_long_lived("email.mime.multipart")
    frozen, passes = gc.get_freeze_count(), len(full)
    again = import_long_lived("email.mime.multipart")
    print(json.dumps({
        "name": module.__name__, "same": again is module, "frozen": frozen,
        "frozen_again": gc.get_freeze_count(), "passes": passes, "enabled": gc.isenabled(),
    }))
    """
)


def _probe(mode: str) -> dict:
    # Every full collection during the import would show; a low threshold makes them likely.
    code = "import gc; gc.set_threshold(10, 1, 1)\n" + PROBE
    done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.timeout(90)
def test_the_first_import_pauses_the_collector_and_freezes_what_it_made():
    seen = _probe("on")
    assert seen["name"] == "email.mime.multipart" and seen["same"]
    assert seen["passes"] == 0  # no full collection while importing, even at threshold 10
    assert seen["frozen"] > 1000  # the interpreter's and the modules' objects
    assert seen["frozen_again"] == seen["frozen"]  # imported already: nothing more frozen
    assert seen["enabled"]


@pytest.mark.timeout(90)
def test_a_collector_turned_off_elsewhere_is_left_alone():
    seen = _probe("off")
    assert seen["name"] == "email.mime.multipart"
    assert seen["frozen"] == 0
    assert not seen["enabled"]
