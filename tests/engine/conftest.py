"""The engine tests' shared runs."""

from __future__ import annotations

import pytest

from tests.engine.resume_story import ResumeStory


@pytest.fixture(scope="session")
def resume_story(tmp_path_factory) -> ResumeStory:
    """tests.engine.resume_story's runs, each made once for the session."""
    return ResumeStory(tmp_path_factory.mktemp("resume_story"))
