"""The memory the preflight checks each rank for: the whole model's state under ddp, a rank's share under fsdp."""

from __future__ import annotations

import pytest

from clorch.train.preflight import _estimate
from clorch.plan.plan import plan_overrides

pytestmark = pytest.mark.timeout(120)

_GPT = ["+recipe=gpt_bf16", "launcher.nproc_per_node=2", "backend=gloo"]


def test_a_sharded_rank_is_checked_for_its_share_and_the_checkpoint_for_the_whole_model():
    whole = _estimate(plan_overrides([*_GPT, "parallel=ddp"]))
    shard = _estimate(plan_overrides([*_GPT, "parallel=fsdp"]))
    assert whole["model_params"] > 0
    assert shard["model_params"] == -(-whole["model_params"] // 2)
    assert shard["checkpoint_bytes"] == whole["checkpoint_bytes"] == whole["model_params"] * 4 * (1 + 2)  # AdamW
    assert shard["optimizer_states"] == whole["optimizer_states"] == 2
