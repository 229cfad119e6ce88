"""The GPU table's rows hold together: each figure sourced, and the FP32 peak equal to SMs x lanes x 2 x clock."""

import pytest

from tests.conftest import ROOT
from tunelab import hardware, yaml_input
from tunelab.report import accuracy, evidence, resource_tables

FP32_LANES_PER_SM = {
    "V100": 64,  # Volta whitepaper: 64 FP32 cores per SM
    "T4": 64,  # Turing whitepaper: 64 FP32 cores per SM
    "A100": 64,  # GA100 (A100 whitepaper): 64 FP32 cores per SM
    "A10G": 128,  # GA10x: 128 FP32 lanes per SM (GA102 whitepaper)
    "L40S": 128,  # Ada whitepaper: 128 FP32 lanes per SM
    "L4": 128,  # Ada whitepaper
    "RTX-4090": 128,
    "RTX-A6000": 128,  # GA10x
    "H100": 128,  # Hopper whitepaper: 128 FP32 cores per SM
    "H200": 128,
    "B200": 128,  # Blackwell: 128 FP32 lanes per SM, as Hopper
}


def _lanes(name: str) -> int:
    return next(v for k, v in FP32_LANES_PER_SM.items() if name.startswith(k))


@pytest.mark.parametrize("name", sorted(hardware.table()))
def test_every_row_is_sourced_and_its_fp32_peak_is_sms_x_lanes_x_clock(name):
    """A row's SM count and clock reproduce its datasheet FP32 peak within 2% (an A10 row's 72 SMs or its 1695 MHz
    would give 31.2 TFLOP/s against the A10G datasheet's 35); every peak and bandwidth names its source."""
    gpu = hardware.lookup(name)
    assert gpu.sms and gpu.boost_mhz, name
    assert gpu.peak_source and gpu.bandwidth_source and gpu.clock_source and gpu.sms_source, name
    implied = gpu.sms * _lanes(name) * 2 * gpu.boost_mhz * 1e6 / 1e12
    assert implied == pytest.approx(gpu.peak_tflops["fp32"], rel=0.02), (name, implied)


def test_the_a10g_is_not_an_a10():
    """AWS's A10G runs 16-bit tensor math at 70 TFLOP/s dense (its datasheet), not the A10's 125: the planner's
    matmul time on an A10G is 125/70 of what the A10's figure would give."""
    a10g = hardware.lookup("A10G")
    assert a10g.peak_tflops["bf16"] == 70 and a10g.peak_tflops["tf32"] == 35 and a10g.sms == 80
    assert a10g.peak_flops("bf16-true") == 70e12


@pytest.mark.parametrize(
    ("given", "key"), [("h200", "H200"), ("rtx4090", "RTX-4090"), ("RTX 4090", "RTX-4090"), ("a100_80gb", "A100-80GB")]
)
def test_a_gpu_is_found_whatever_its_case_and_separators(given, key):
    assert hardware.lookup(given).name == key


@pytest.mark.parametrize(
    ("given", "named"),
    [("h100", "H100-PCIe or H100-NVL or H100-SXM"), ("A100", "A100-40GB or A100-80GB-PCIe or A100-80GB\\?")],
)
def test_a_prefix_of_several_gpus_names_them_instead_of_picking_one(given, named):
    """'h100' is three boards with different links and memory rates: the plan must not choose one silently."""
    with pytest.raises(ValueError, match=f"did you mean {named}"):
        hardware.lookup(given)


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
    ],
)
def test_a_device_name_as_nvidia_smi_prints_it_is_its_row(given, key):
    """`--gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader)"`: the board's own name finds its row as a record's
    does (whole words), and only a name in that form: 'A100 PCIe' is no key and no device name, so it is refused, not
    read as the A100 80GB SXM row its 'a100' would match."""
    assert hardware.lookup(given).name == key
    with pytest.raises(ValueError, match="unknown GPU 'A100 PCIe'"):
        hardware.lookup("A100 PCIe")
    with pytest.raises(ValueError, match="unknown GPU 'NVIDIA L40'"):
        hardware.lookup("NVIDIA L40")  # a board without a row stays unknown


@pytest.mark.parametrize("given", ["", "-", "Z9000"])
def test_an_unknown_gpu_lists_every_known_name(given):
    with pytest.raises(
        ValueError, match="unknown GPU .*; fix: a row of configs/hardware/gpus.yaml: V100-16GB, .*H200, B200$"
    ):
        hardware.lookup(given)


@pytest.mark.parametrize(
    ("device", "row"),
    [
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", None),
        ("NVIDIA RTX A6000", "RTX-A6000"),
        ("NVIDIA RTX A1000", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", None),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("Tesla T4", "T4"),
    ],
)
def test_a_device_name_matches_a_row_by_whole_words_only(device, row):
    """A record's MFU divides by the row its device name matches: an L40S read as an L4 (362 against 121 TFLOP/s
    of bf16) would triple its MFU, an RTX A1000 read as an A100 would divide it by ten. A board without a row gets
    none (no MFU, never a guess)."""
    found = hardware.identify(device)
    assert (found.name if found else None) == row


def test_a_row_names_the_timed_runs_that_check_its_time_and_only_rows_that_have_some_do():
    """The plan says its time on a GPU is checked against the row's timed runs, or is an extrapolation: the rows that
    name some are exactly the GPUs that our measurements (reports/evidence.yaml), the lab's timed rows and the
    published check sets (configs/published/) ran on."""
    timed = {e.device for e in evidence.entries().values() if e.device != "cpu"}
    timed |= {r.gpu for sweep in ("lab-part1", "lab-part2") for r in accuracy.lab_rows(sweep) if r.lab.get("time_s")}
    published = ROOT / "configs" / "published"
    hub = yaml_input.load_mapping(published / "litgpt-config-hub.yaml", "the config_hub table")["rows"]
    timed |= {row["machine"].split("x", 1)[1] for row in hub if row.get("minutes")}
    timed |= {yaml_input.load_mapping(published / "fsdp-multinode.yaml", "the multi-node table")["gpu"]}
    generate = yaml_input.load_mapping(published / "litgpt-generate.yaml", "the generation table")["rows"]
    timed |= {row["gpu"] for row in generate if row.get("seconds")}
    resources = yaml_input.load_mapping(published / "litgpt-resource-tables.yaml", "the resource tables")["rows"]
    timed |= {resource_tables.GPU for row in resources if row.get("minutes")}  # the table's one GPU
    assert timed <= set(hardware.table()), timed - set(hardware.table())
    assert {g.name for g in hardware.table().values() if g.timed_by} == timed
    unchecked = hardware.time_checked(hardware.lookup("L40S"))
    assert unchecked.startswith("no timed run on L40S checks it") and all(g in unchecked for g in sorted(timed))
    assert hardware.time_checked(hardware.lookup("H200")).startswith("against our runs")
