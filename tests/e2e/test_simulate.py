"""scripts/replay_allocator.py's refusals, as a child process: one line each before any replay. The simulated step's
own checks are in tests/plan/test_simulate.py and tests/accuracy/test_simulate.py, `plan --simulate`'s output in
tests/cli/test_plan_json.py."""

from __future__ import annotations

from tests.conftest import ROOT


def test_the_replay_script_refuses_bad_archives_and_outputs_in_one_line_before_replaying(tmp_path):
    """scripts/replay_allocator.py: a file that is not a tar, a record that is not JSON, a row the archive does not
    hold, a rank file without iterations or with iterations that are not numbers, an unknown recipe, and an --out whose folder is missing are each one line and exit 2, the output
    checked before any replay (a replay takes minutes)."""
    import io
    import subprocess
    import sys
    import tarfile

    def archive(members: dict):
        path = tmp_path / f"a{len(list(tmp_path.iterdir()))}.tgz"
        with tarfile.open(path, "w:gz") as tar:
            for name, text in members.items():
                data = text.encode()
                info = tarfile.TarInfo(f"records/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    rec = '{"status": "ok", "row_id": "r", "recipe": "%s", "overrides": []}'
    not_tar = tmp_path / "x.tgz"
    not_tar.write_text("not a tar")
    cases = [
        ([not_tar, "r"], "not a tar archive"),
        ([archive({"r/record.json": "{not json"}), "r"], "r/record.json: not JSON"),
        (
            [archive({"r/record.json": rec % "tiny-llama-1.1b/lora"}), "other"],
            "not in the archive; fix: a row id it holds (r)",
        ),
        (
            [
                archive(
                    {
                        "r/record.json": rec % "tiny-llama-1.1b/lora",
                        "r/stats/rank0.json": '{"iters": [["a", "b", "c"]]}',
                    }
                ),
                "r",
            ],
            "iters are not [time, padded, real] numbers",
        ),
        (
            [archive({"r/record.json": rec % "tiny-llama-1.1b/lora", "r/stats/rank0.json": '{"iters": []}'}), "r"],
            "no iterations",
        ),
        ([archive({"r/record.json": rec % "no/such", "r/stats/rank0.json": '{"iters": [[1, 2, 3]]}'}), "r"], "no/such"),
        ([not_tar, "r", "--out", tmp_path / "missing" / "t.md"], "--out"),
    ]
    for argv, fragment in cases:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "replay_allocator.py"), *map(str, argv)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], (argv, lines)
        assert "Traceback" not in proc.stderr
