"""A Qwen3-VL checkpoint's image preprocessing comes from its preprocessor_config.json, as transformers
reads it.

Released Qwen3-VL checkpoints resize to 65,536..16,777,216 pixels and normalise with mean = std = 0.5, not the
Qwen2-VL processor defaults (CLIP statistics, 3,136..1,003,520 pixels) that rz's tiny random-init models use:
rz must read the file, feed the tower what transformers' processor loaded from the same file gives, and write
the file back when it saves a checkpoint.
"""

import json

import pytest
import torch

from rz_agents.model.checkpoint import CheckpointError, read_model_config, save_hf_checkpoint
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import ImageProcessing, Qwen3VLConfig
from rz_agents.model.vl_processor import preprocess_images

pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
Image = pytest.importorskip("PIL.Image")

# The fields of Qwen/Qwen3-VL-*-Instruct's preprocessor_config.json that decide the pixels
RELEASED = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def _image(w: int, h: int) -> "Image.Image":
    g = torch.Generator().manual_seed(w * 1000 + h)
    return Image.fromarray(torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy())


def _checkpoint(tmp_path, preprocessor: dict | None):
    config = Qwen3VLConfig.tiny()
    config.vision.patch_size = 16
    model = Qwen3VLModel(config)
    path = save_hf_checkpoint(model, tmp_path / "ckpt")
    if preprocessor is None:
        (path / "preprocessor_config.json").unlink()
    else:
        (path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return path


def test_the_released_preprocessing_is_read_and_equals_transformers_processor_from_the_same_file(tmp_path):
    path = _checkpoint(tmp_path, RELEASED)
    vision = read_model_config(path).vision
    assert vision.image_processing == ImageProcessing(65536, 16777216, [0.5] * 3, [0.5] * 3)
    hf = pil.Qwen2VLImageProcessorPil.from_pretrained(path)
    images = [_image(300, 200), _image(640, 360)]  # 60,000 px (scaled up to the minimum) and 230,400 px
    ours = preprocess_images(images, vision)
    theirs = hf(images=images, return_tensors="pt")
    assert torch.equal(ours[1], theirs["image_grid_thw"])
    assert torch.equal(ours[0], theirs["pixel_values"])
    # negative control: the defaults give other grids and other pixels for the same pictures
    default = read_model_config(_checkpoint(tmp_path / "old", None)).vision
    assert default.image_processing == ImageProcessing()
    pixels, grids = preprocess_images(images, default)
    assert not torch.equal(grids, ours[1])
    assert grids[0].prod() < ours[1][0].prod()  # the released minimum area enlarges the small picture


def test_saving_writes_the_preprocessing_and_reading_it_back_is_exact(tmp_path):
    config = Qwen3VLConfig.tiny()
    config.vision.image_processing = ImageProcessing(4096, 65536, [0.5, 0.4, 0.3], [0.2, 0.3, 0.4])
    path = save_hf_checkpoint(Qwen3VLModel(config), tmp_path / "ckpt")
    assert read_model_config(path).vision.image_processing == config.vision.image_processing
    assert "image_processing" not in json.loads((path / "config.json").read_text())["vision_config"]
    hf = pil.Qwen2VLImageProcessorPil.from_pretrained(path)  # transformers reads what rz wrote
    image = _image(100, 70)
    assert torch.equal(
        preprocess_images([image], config.vision)[0], hf(images=[image], return_tensors="pt")["pixel_values"]
    )


def test_a_broken_preprocessor_config_is_refused_naming_the_file(tmp_path):
    path = _checkpoint(tmp_path, {**RELEASED, "image_std": [0.5, 0.0, 0.5]})
    with pytest.raises(CheckpointError, match="preprocessor_config.json.*image_std"):
        read_model_config(path)
    (path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="preprocessor_config.json"):
        read_model_config(path)


def test_the_real_size_presets_preprocess_as_the_released_checkpoints_do():
    from rz_agents.model.presets import preset_config

    released = ImageProcessing.from_hf(RELEASED)
    for name in ("qwen3-vl-2b-instruct", "qwen3-vl-4b-instruct", "qwen3-vl-8b-instruct"):
        assert preset_config(name).vision.image_processing == released, name
    assert Qwen3VLConfig.tiny().vision.image_processing == ImageProcessing()  # tiny demos keep theirs
