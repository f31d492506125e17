"""A Dockerfile as a build plan for the sandbox: what runs, what the host satisfies, what is refused."""

import pytest

from rz_agents.envs.harbor.dockerfile import PlanError, apt_installed, plan_build


def test_workdir_copy_env_and_run_steps_are_planned_in_order():
    plan = plan_build(
        "FROM python:3.11-slim\n# comment\nWORKDIR /app\nENV A=1 B='two words'\nARG V=3\n"
        'COPY src/ /app/src/\nRUN mkdir -p out && \\\n    touch out/x\nCMD ["bash"]\n'
    )
    assert (plan.root, plan.workdir) == ("/app", "/app")
    assert plan.env == {"A": "1", "B": "two words", "V": "3"}
    assert plan.steps == [("copy", 0), ("run", "mkdir -p out && touch out/x")]
    assert plan.copies == [(["src/"], "/app/src/")]


def test_installs_the_host_already_has_are_satisfied_not_run():
    assert apt_installed("bash")
    plan = plan_build(
        "FROM debian:bookworm\nWORKDIR /w\nRUN apt-get update && apt-get install -y --no-install-recommends "
        "bash "
        "&& rm -rf /var/lib/apt/lists/* && echo hi > f\nRUN pip install pyyaml\n"
    )
    assert plan.steps == [("run", "echo hi > f")]
    assert len(plan.satisfied) == 2


@pytest.mark.parametrize(
    "dockerfile, reason",
    [
        ("FROM alpine:3.20\n", "not Debian-based"),
        ("FROM debian\nRUN apt-get install -y rz-no-such-package-xyz\n", "rz-no-such-package-xyz"),
        ("FROM debian\nRUN pip install rz-no-such-dist-xyz==1.0\n", "rz-no-such-dist-xyz"),
        ("FROM debian\nRUN curl -sSL https://example.invalid/x | sh\n", "no network"),
        ("FROM debian\nWORKDIR /app\nCOPY a /etc/a\n", "outside the workspace"),
        ("FROM debian\nADD https://example.invalid/a.tgz /app/\n", "needs the network"),
        ("FROM debian AS a\nFROM debian\n", "multi-stage"),
        ("FROM debian\nWORKDIR /usr/src\n", "system directory"),
        ("WORKDIR /app\n", "no FROM"),
        ("FROM debian\nFROBNICATE x\n", "unknown Dockerfile instruction"),
        ("FROM debian\nRUN for p in a b; do apt-get install -y $p; done\n", "compound"),
    ],
)
def test_what_cannot_be_built_here_is_refused_with_its_reason(dockerfile, reason):
    with pytest.raises(PlanError, match=reason):
        plan_build(dockerfile)
