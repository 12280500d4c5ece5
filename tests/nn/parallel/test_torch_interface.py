"""clorch's DistributedDataParallel as torch code sees it: isinstance, attributes, torch's methods.

In one process (world size 1, no process group); the comm hooks run on
real ranks in test_comm_hooks.py.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from clorch.nn.parallel import DistributedDataParallel, unwrap_model
from clorch.nn.parallel.torch_ddp import HARMLESS, TORCH_DDP
from tests.nn import models as m

pytestmark = pytest.mark.timeout(60)


def _torch_unwrap(model):
    """The unwrap helper torch training scripts carry."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def test_passes_torchs_isinstance_check_and_unwraps():
    model = m.mlp()
    ddp = DistributedDataParallel(model)
    assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert _torch_unwrap(ddp) is model and unwrap_model(ddp) is model
    assert list(_torch_unwrap(ddp).state_dict()) == list(model.state_dict())  # no `module.` prefix


def test_has_torchs_public_attributes_with_torchs_values():
    ddp = DistributedDataParallel(
        m.mlp(), bucket_cap_mb=2.0, broadcast_buffers=False, dim=0, gradient_as_bucket_view=True
    )
    assert ddp.device_ids is None and ddp.output_device is None  # a CPU module, as in torch
    assert ddp.device == torch.device("cpu") and ddp.device_type == "cpu"
    assert ddp.dim == 0 and ddp.broadcast_buffers is False and ddp.find_unused_parameters is False
    assert ddp.process_group is None  # no group in this process (torch's would hold the default one)
    assert ddp.bucket_bytes_cap == 2 * 1024 * 1024 and ddp.bucket_bytes_cap_default is False
    assert ddp.static_graph is False and ddp.gradient_as_bucket_view is True
    assert ddp.require_backward_grad_sync is True and ddp.require_forward_param_sync is True
    assert DistributedDataParallel(m.mlp()).bucket_bytes_cap_default is True


def test_broadcast_buffers_is_settable_as_in_torch():
    ddp = DistributedDataParallel(m.WithBatchNorm())
    assert ddp.broadcast_buffers is True and ddp.forward_sync_buffers is True
    ddp.broadcast_buffers = False
    assert ddp.broadcast_buffers is False and ddp.will_sync_module_buffers() is False


def test_set_static_graph_records_it_and_warns_the_second_time():
    ddp = DistributedDataParallel(m.mlp())
    ddp._set_static_graph()
    assert ddp.static_graph is True
    with pytest.warns(UserWarning, match="static_graph"):
        ddp._set_static_graph()
    assert DistributedDataParallel(m.mlp(), static_graph=True).static_graph is True


def test_forward_train_eval_and_state_dict_behave_as_torchs():
    torch.manual_seed(0)
    model = m.WithBatchNorm()
    ddp = DistributedDataParallel(model)
    assert ddp.train() is ddp and model.training
    assert ddp.eval() is ddp and not model.training
    x = torch.randn(5, m.IN, dtype=torch.float64)
    assert torch.equal(ddp(x), model(x))
    assert list(ddp.state_dict()) == ["module." + k for k in model.state_dict()]
    assert [n for n, _ in ddp.named_parameters()] == ["module." + n for n, _ in model.named_parameters()]


def test_no_sync_is_clorchs_and_restores_the_flag():
    ddp = DistributedDataParallel(m.mlp())
    with ddp.no_sync():
        assert ddp.require_backward_grad_sync is False
    assert ddp.require_backward_grad_sync is True


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda d: pickle.loads(pickle.dumps(d))], ids=["deepcopy", "pickle"])
def test_copies_train_like_the_original(copier):
    ddp = DistributedDataParallel(m.mlp())
    twin = copier(ddp)
    assert isinstance(twin, DistributedDataParallel) and twin.module is not ddp.module
    x, y = m.batches(1, 8, seed=3)[0]
    for model in (ddp, twin):
        m.loss_fn(model(x), y).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ddp.parameters(), twin.parameters()))


def test_a_model_stepping_in_backward_refuses_to_be_copied():
    ddp = DistributedDataParallel(m.mlp())
    ddp.step_in_backward(torch.optim.SGD(ddp.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="step_in_backward"):
        copy.deepcopy(ddp)


def test_logging_data_has_torchs_main_keys():
    data = DistributedDataParallel(m.mlp(), bucket_cap_mb=1.0)._get_ddp_logging_data()
    assert data["world_size"] == 1 and data["rank"] == 0 and data["module_name"] == "Sequential"
    assert data["bucket_cap_bytes"] == 1024 * 1024 and data["comm_hook"] == "" and data["reducer"] == "clorch"
    assert data["num_parameter_tensors"] == 6 and data["dtypes"] == "float64"


def test_comm_hook_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(m.mlp()).register_comm_hook(None, default_hooks.allreduce_hook)


def test_check_reducer_finalized_and_remove_autograd_hooks():
    ddp = DistributedDataParallel(m.mlp())
    ddp.step_in_backward(torch.optim.SGD(ddp.parameters(), lr=0.1))  # builds a reducer at world size 1
    ddp._check_reducer_finalized()  # no backward in flight
    ddp._remove_autograd_hooks()
    assert ddp.buckets == []


def test_torchs_internals_are_refused_by_name():
    ddp = DistributedDataParallel(m.mlp())
    with pytest.raises(NotImplementedError, match=r"DistributedDataParallel\.join .*synchronized backwards"):
        ddp.join()
    with pytest.raises(NotImplementedError, match="join_device"):
        ddp.join_device
    with pytest.raises(NotImplementedError, match="step_in_backward"):
        ddp._register_fused_optim(torch.optim.SGD, lr=0.1)
    with pytest.raises(NotImplementedError, match="_pre_forward"):
        ddp._pre_forward(torch.zeros(1))


def test_every_member_of_torchs_class_is_clorchs_refused_or_harmless():
    # A member torch adds in a later version is refused by the class decorator, never inherited as is.
    for name, member in vars(TORCH_DDP).items():
        if name.startswith("__") and name not in ("__getstate__", "__setstate__"):
            continue
        if not (callable(member) or isinstance(member, (property, staticmethod, classmethod))):
            continue
        ours = getattr(DistributedDataParallel, name)
        inherited = ours is getattr(TORCH_DDP, name)
        assert not inherited or name in HARMLESS, name


def test_compile_of_the_wrapper_still_runs_clorchs_forward():
    ddp = DistributedDataParallel(m.mlp())
    x = torch.randn(4, m.IN, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(ddp, backend="eager")(x)
    assert torch.allclose(out, ddp.module(x))


def test_refuses_to_run_alone_when_the_environment_says_world_size_2(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        RuntimeError,
        match=r"WORLD_SIZE=2.*clorch\.distributed\.process_group\(\)"
        r".*clorch\.distributed\.init_process_group\(\)",
    ):
        DistributedDataParallel(m.mlp())
    monkeypatch.setenv("WORLD_SIZE", "1")
    DistributedDataParallel(m.mlp())  # a job of one rank runs without a group, as before
