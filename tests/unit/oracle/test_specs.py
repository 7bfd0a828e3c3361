"""Device specs and model shapes: parameter counts against the published totals, config parsing, validation."""

import pytest

from oracle.cpu_device import calibrate_cpu
from oracle.specs import MODEL_SHAPES, DeviceSpec, ModelShape, ascend_910c_die, device, h200, model_shape

# Published totals (model cards / papers), in billions of parameters.
PUBLISHED_PARAMS_B = {
    "qwen2-0.5b": 0.49,
    "qwen2-1.5b": 1.54,
    "qwen2-7b": 7.62,
    "llama-3-8b": 8.03,
    "qwen2.5-14b": 14.7,
    "qwen2.5-32b": 32.8,  # safetensors total on the model page (the card's "32.5B" rounds embeddings differently)
    "llama-3-70b": 70.6,
    "deepseek-v3-671b": 671.0,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS_B))
def test_parameter_count_matches_published(name):
    shape = model_shape(name)
    assert shape.num_params / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[name], rel=0.02)


def test_deepseek_activates_about_37b_per_token():
    shape = model_shape("deepseek-v3-671b")
    assert shape.is_moe and shape.is_mla
    assert shape.num_active_params / 1e9 == pytest.approx(37.0, rel=0.03)
    assert shape.kv_elements_per_token_per_layer == 576  # 512 latent + 64 rotary


def test_catalogue_spans_half_a_billion_to_671b():
    sizes = sorted(s.num_params for s in MODEL_SHAPES.values())
    assert sizes[0] < 0.6e9 and sizes[-1] > 600e9


def test_from_hf_config_reproduces_catalogued_qwen2_7b():
    config = {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    parsed = ModelShape.from_hf_config(config, name="qwen2-7b")
    assert parsed == model_shape("qwen2-7b")


def test_from_hf_config_reads_float32_bytes():
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_hidden_layers": 2, "vocab_size": 100, "torch_dtype": "float32"}
    shape = ModelShape.from_hf_config(config)
    assert shape.bytes_per_param == 4 and shape.num_kv_heads == 4 and shape.head_dim == 16


def test_bad_shapes_and_devices_are_refused():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelShape("x", 2, 64, 6, 4, 16, 128, 100)
    with pytest.raises(ValueError, match="MoE"):
        ModelShape("x", 2, 64, 4, 4, 16, 128, 100, num_experts=8, num_active_experts=9, moe_intermediate_size=32)
    with pytest.raises(ValueError, match="hbm_bytes"):
        DeviceSpec("x", 0, 1.0, 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="unknown device"):
        device("tpu")
    with pytest.raises(ValueError, match="unknown model shape"):
        model_shape("gpt-5")
    with pytest.raises(ValueError, match="tensor parallelism"):
        model_shape("qwen2-0.5b").check_tp(4)  # 14 heads


def test_h200_uses_the_bandwidths_measured_on_one_and_takes_others_measured_elsewhere():
    assert h200().h2d_bytes_per_s == 55.2e9 and h200().local_copy_bytes_per_s == 3823.1e9
    spec = h200({"h2d_pinned": 12.5, "d2d": 1000.0})
    assert spec.h2d_bytes_per_s == 12.5e9 and spec.local_copy_bytes_per_s == 1000e9
    assert h200({"d2d": 1000.0}).h2d_bytes_per_s == 55.2e9, "a figure not given stays the built-in one"


def test_devices_are_ordered_as_their_datasheets_say():
    gpu, npu = h200(), ascend_910c_die()
    assert gpu.hbm_bytes > npu.hbm_bytes and gpu.hbm_bytes_per_s > npu.hbm_bytes_per_s
    assert gpu.ridge_flops_per_byte == pytest.approx(gpu.peak_bf16_flops_per_s / gpu.hbm_bytes_per_s)


def test_cpu_calibration_measures_positive_speeds():
    spec = calibrate_cpu(num_bytes=8 * 2**20, matmul_dim=128, repeats=2)
    # loose floors: on this shared machine a loaded core still does > 10 MFLOP/s and copies > 10 MB/s
    assert spec.peak_bf16_flops_per_s > 1e7
    assert spec.hbm_bytes_per_s > 1e7 and spec.disk_bytes_per_s > 1e6
    assert spec.hbm_bytes > 2**30
    with pytest.raises(ValueError):
        calibrate_cpu(num_bytes=10)
