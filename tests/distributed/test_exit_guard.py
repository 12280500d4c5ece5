"""The exit handler that lets gloo's worker threads drop their work before the interpreter finalizes.

Its effect is a race (a finished 2-rank script aborting at exit now and then);
tests/test_readme_torchrun.py runs such a script under torchrun (without the
handler it aborted in about one run of three). Here: it is registered once.
"""

from __future__ import annotations

import atexit

import pytest

from clorch.distributed import exit_guard

pytestmark = pytest.mark.timeout(60)


def test_registered_once_however_often_it_is_asked():
    exit_guard.watch_process_group()
    before = atexit._ncallbacks()
    exit_guard.watch_process_group()
    exit_guard.watch_process_group()
    assert atexit._ncallbacks() == before
    assert exit_guard._registered
