"""tools/readme_walkthrough.py knows every command of the README and of docs/*.md (each is run or skipped with a
reason), and finds commands the way a reader types them. The walkthrough itself runs in CI:
`python tools/readme_walkthrough.py`."""

from pathlib import Path

import pytest
from tools_module import tool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def walk():
    with tool("readme_walkthrough") as module:
        yield module


def test_every_documented_command_is_planned_and_every_skip_says_why(walk):
    commands = walk.doc_commands()
    assert commands["ebctl simulate --profile qwen3-8b/rtx-pro-6000 --workload azure-conv --concurrency 256 "
                    "--policies 'v0,sglang:pd-interval=8,default,default:ttft=10,tpot=0.1' --slo-ttft 10 "
                    "--slo-tpot 0.1"] == "README.md"  # the README's simulator example, as written
    assert commands["python tools/learn_table.py"] == "docs/controller.md"  # moved out of the README, still walked
    assert {p.relative_to(REPO).as_posix() for p in walk.docs()} >= {"README.md", "docs/cli.md", "docs/simulator.md"}
    assert not any(p.relative_to(REPO).as_posix().startswith("docs/results/") for p in walk.docs())
    assert [c for c in commands if c not in walk.PLAN] == []
    for cmd, step in walk.PLAN.items():
        assert step.how in ("run", "demo", "sglang", "skip"), cmd
        assert step.why or step.how != "skip", f"{cmd}: a skip needs its reason"
        assert step.why or not step.slow, f"{cmd}: a slow step says why it waits for --all"
    stale = [c for c in walk.PLAN if c not in commands]
    assert stale == [], "planned commands no longer in the README or docs/*.md"


def test_commands_are_found_as_a_reader_types_them(walk):
    text = ("Intro `ebctl status` inline is prose.\n```bash\npip install -e . && ebctl start   # the demo\n"
            "# a comment line\n\nebctl  status   --watch\n```\n```python\nprint('not a command')\n```\n"
            "Run `python tools/fit_traces.py` and `bash tools/sglang_env.sh | tail -1`.\n"
            "```sh\nebctl status --watch\n```")
    assert walk.readme_commands(text) == ["pip install -e . && ebctl start", "ebctl status --watch",
                                          "python tools/fit_traces.py", "bash tools/sglang_env.sh | tail -1"]
