"""The matris command's thread wait policy (issue 65, item 5): idle OpenMP threads sleep instead of
spinning, so two matris processes on one machine share its cores; a policy the user sets holds."""

import os
import subprocess
import sys

import pytest

from matris.threads import DEFAULT, USER_POLICY, set_wait_policy


def test_the_policy_is_set_where_none_is_given():
    env = {"PATH": "/bin"}
    assert set_wait_policy(env) == {"OMP_WAIT_POLICY": "PASSIVE"} == DEFAULT
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "300000"),
                                         ("KMP_BLOCKTIME", "200")])
def test_a_users_policy_holds(name, value):
    env = {name: value}
    assert set_wait_policy(env) == {} and env == {name: value}
    assert name in USER_POLICY


def _policy_in_a_command(env_extra: dict) -> str:
    """OMP_WAIT_POLICY as the OpenMP runtime of a ``matris`` command process sees it: the command
    runs, then the process reports the environment torch was imported under."""
    code = ("import os, sys; from matris.cli import main; assert 'torch' not in sys.modules; "
            "main(['models']); import torch; assert 'torch' in sys.modules; "
            "print('POLICY', os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k not in USER_POLICY}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("POLICY"))


def test_the_command_sets_it_before_torch_loads():
    assert _policy_in_a_command({}) == "PASSIVE"
    assert _policy_in_a_command({"GOMP_SPINCOUNT": "300000"}) == "None"
    assert _policy_in_a_command({"OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
