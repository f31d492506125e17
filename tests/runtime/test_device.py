"""model.device / --device: cpu, cuda or cuda:N, with one clear error when malformed or absent."""

import pytest
import torch

from rz_agents.runtime import ModelSpec, TrainConfig
from rz_agents.runtime.device import DeviceError, check_device_name, resolve_device
from rz_agents.runtime.factories import build_model

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:0", "cuda:3"])
def test_well_formed_device_names_pass(name):
    check_device_name(name)


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", "", "mps"])
def test_malformed_device_names_name_the_field(name):
    with pytest.raises(DeviceError, match="model.device must be cpu, cuda or cuda:N"):
        check_device_name(name)


@no_gpu
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(DeviceError, match="no CUDA GPU is available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="model.device cuda: no CUDA GPU"):
        build_model(ModelSpec(device="cuda"), vocab_size=320)


def test_train_config_checks_the_device_and_the_learner_process():
    cfg = TrainConfig(model=ModelSpec(device="gpu0"))
    with pytest.raises(ValueError, match="model.device"):
        cfg.validate()
    cfg = TrainConfig(model=ModelSpec(device="cuda"), learner_process=True)
    with pytest.raises(ValueError, match="learner_process: true needs model.device: cpu"):
        cfg.validate()
    TrainConfig(model=ModelSpec(device="cuda")).validate()  # valid even where no GPU is present


def test_cpu_model_is_built_on_cpu():
    model = build_model(ModelSpec(device="cpu"), vocab_size=320)
    assert model.device == torch.device("cpu")
