"""The environment table (pipeline/present/environment.py): its rows (each package's version or
that it is missing, the cpus this process may use, threads and the variables that change them,
the git revision or why there is none)."""

from __future__ import annotations

import re
import subprocess

from pipeline.present import environment


def test_the_environment_names_threads_variables_and_packages(monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = environment.environment(3, tmp_path)
    assert list(env) == [
        "python",
        *environment.PACKAGES,
        "platform",
        "cpus (visible / total)",
        "torch threads (train.threads)",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "git revision",
    ]
    assert env["torch threads (train.threads)"] == "3"
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "unset")
    unknown = env["git revision"]  # tmp_path is no git checkout: why there is no revision
    assert not re.fullmatch(r"[0-9a-f]{40}", unknown)
    default = environment.environment(None, tmp_path)["torch threads (train.threads)"]
    assert default != "3" and not default.isdigit()  # torch's own default, said as such
    # the git revision's value when git is missing is another reason than outside a checkout
    monkeypatch.setattr(environment.subprocess, "run", _no_git)
    assert environment.environment(1, tmp_path)["git revision"] not in (unknown, "")


def _no_git(*args, **kwargs):
    raise FileNotFoundError("git")


def test_the_environment_gives_each_packages_installed_version_or_says_it_is_not_installed(
    monkeypatch, tmp_path
):
    installed = {"numpy": "1.2.3", "torch": "9.8.7+cpu"}

    def version(name):
        if name not in installed:
            raise environment.importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(environment.importlib.metadata, "version", version)
    env = environment.environment(1, tmp_path)
    assert {name: env[name] for name in installed} == installed
    absent = {env[name] for name in environment.PACKAGES if name not in installed}
    assert len(absent) == 1 and not any(c.isdigit() for c in absent.pop())  # one word for all, no version


def test_the_environment_counts_the_cpus_this_process_may_use_of_the_machines(monkeypatch, tmp_path):
    asked = []

    def affinity(pid):
        asked.append(pid)
        return {0, 3, 5}

    monkeypatch.setattr(environment.os, "sched_getaffinity", affinity, raising=False)
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 8)
    assert environment.environment(1, tmp_path)["cpus (visible / total)"] == "3 / 8"
    assert asked == [0]  # this process
    monkeypatch.delattr(environment.os, "sched_getaffinity")  # macOS and Windows have no affinity call
    assert environment.environment(1, tmp_path)["cpus (visible / total)"] == "? / 8"


def test_the_environment_reads_the_git_revision_or_says_git_is_missing(monkeypatch, tmp_path, capfd):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    capfd.readouterr()
    assert environment.environment(1, tmp_path)["git revision"] == head.strip()
    assert capfd.readouterr() == ("", "")  # git's own output is captured, not printed
    monkeypatch.setattr(environment.subprocess, "run", _no_git)
    assert environment.environment(1, tmp_path)["git revision"] != head.strip()
