"""pgqctl.policy: what a worker's policy lets a job run, and reading its file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pgqctl.errors import BadInput
from pgqctl.payload import PayloadRejected, check_policy, command_for_job
from pgqctl.policy import LOADER_PREFIXES, LOADER_VARIABLES, Policy, read_policy, with_flags
from pgqctl.runner import Command

SH = os.path.realpath("/bin/sh")
ENVIRON = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C"}


def command(
    payload: object,
    policy: Policy | None,
    *,
    kind: str = "job",
    allow_shell: bool = False,
    handlers: dict[str, tuple[str, ...]] | None = None,
) -> Command:
    return command_for_job(
        payload,
        kind=kind,
        handlers=handlers or {},
        allow_shell=allow_shell,
        default_timeout=None,
        policy=policy,
        environ=ENVIRON,
    )


def refusal(payload: object, policy: Policy | None, **kw: object) -> str:
    with pytest.raises(PayloadRejected) as caught:
        command(payload, policy, **kw)  # type: ignore[arg-type]
    reason = caught.value.reason
    assert "\n" not in reason
    return reason


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """An allowed directory with a script in it, and a symlink out of it."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    script = jobs / "report"
    script.write_text("#!/bin/sh\necho report\n")
    script.chmod(0o755)
    (jobs / "escape").symlink_to(SH)
    (tmp_path / "outside").write_text("#!/bin/sh\n")
    (tmp_path / "outside").chmod(0o755)
    return jobs


# -- programs -------------------------------------------------------------------


def test_sh_by_name_or_by_path_is_refused_when_the_allowlist_lacks_it(jobs_dir: Path) -> None:
    policy = Policy(programs=(f"{jobs_dir}/",))
    reason = refusal({"argv": ["sh", "-c", "id"]}, policy)
    assert reason == (
        f"program sh ({SH}) is not on the policy's allowlist (programs): "
        f"allow it with --allow-program {SH}"
    )
    assert f"program /bin/sh ({SH}) is not on" in refusal({"argv": ["/bin/sh", "-c", "id"]}, policy)


def test_a_shell_payload_needs_bin_sh_allowed_as_well_as_allow_shell(jobs_dir: Path) -> None:
    narrow = Policy(programs=(str(jobs_dir),))
    assert "not on the policy's allowlist" in refusal({"shell": "id"}, narrow, allow_shell=True)
    assert "--allow-shell" in refusal({"shell": "id"}, Policy(programs=("/bin/sh",)))
    # Entries are resolved too: /bin/sh names whatever file it links to.
    wide = Policy(programs=("/bin/sh",))
    assert command({"shell": "id"}, wide, allow_shell=True).argv == ("/bin/sh", "-c", "id")
    assert command({"argv": ["sh", "-c", "id"]}, wide).argv[0] == "sh"


def test_programs_under_an_allowed_directory_run_and_others_do_not(jobs_dir: Path) -> None:
    policy = Policy(programs=(str(jobs_dir),))
    script = str(jobs_dir / "report")
    assert command({"argv": [script, "--daily"]}, policy).argv == (script, "--daily")
    # Found through the job's PATH, as the runner finds it.
    found = command({"argv": ["report"], "env": {"PATH": str(jobs_dir)}}, with_path(policy))
    assert found.argv == ("report",)
    # Relative to the job's working directory, as the child sees it.
    assert command({"argv": ["./report"], "cwd": str(jobs_dir)}, policy).argv == ("./report",)
    assert "not on the policy's allowlist" in refusal({"argv": ["true"]}, policy)


def with_path(policy: Policy) -> Policy:
    return with_flags(policy, allow_env=["PATH"]) or policy


def test_a_symlink_or_dotdot_out_of_an_allowed_directory_is_refused(jobs_dir: Path) -> None:
    policy = Policy(programs=(f"{jobs_dir}/",))
    reason = refusal({"argv": [str(jobs_dir / "escape"), "-c", "id"]}, policy)
    assert f"({SH}) is not on the policy's allowlist" in reason
    dotdot = f"{jobs_dir}/../outside"
    reason = refusal({"argv": [dotdot]}, policy)
    assert f"{jobs_dir.parent / 'outside'}) is not on" in reason
    # A directory named like the allowed one plus a suffix is not below it.
    sibling = jobs_dir.parent / "jobs-other"
    sibling.mkdir()
    (sibling / "x").write_text("#!/bin/sh\n")
    (sibling / "x").chmod(0o755)
    assert "not on the policy's allowlist" in refusal({"argv": [str(sibling / "x")]}, policy)


def test_an_exact_file_allows_that_file_only(jobs_dir: Path) -> None:
    policy = Policy(programs=(str(jobs_dir / "report"),))
    assert command({"argv": [str(jobs_dir / "report")]}, policy).argv[0].endswith("report")
    assert "not on the policy's allowlist" in refusal({"argv": [str(jobs_dir / "escape")]}, policy)


def test_a_program_that_cannot_be_found_is_refused_under_an_allowlist(jobs_dir: Path) -> None:
    policy = Policy(programs=(str(jobs_dir),))
    reason = refusal({"argv": ["pgqctl-no-such-program"]}, policy)
    assert reason.startswith("command not found: pgqctl-no-such-program")


def test_without_an_allowlist_any_program_runs() -> None:
    assert command({"argv": ["sh", "-c", "id"]}, None).argv[0] == "sh"
    assert command({"argv": ["sh", "-c", "id"]}, Policy()).argv[0] == "sh"


# -- loader variables -----------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PATH", "PYTHONPATH", "BASH_ENV"]
)
def test_loader_variables_are_refused_under_a_policy(name: str) -> None:
    reason = refusal({"argv": ["true"], "env": {name: "/tmp/x"}}, Policy())
    assert reason == (
        f'"env" sets {name}, which changes what programs load or run, and the policy '
        f"does not allow it (allow_env): allow it with --allow-env {name}"
    )


def test_allow_env_lets_a_named_loader_variable_through() -> None:
    policy = Policy(allow_env=frozenset({"PYTHONPATH"}))
    assert command({"argv": ["true"], "env": {"PYTHONPATH": "/srv"}}, policy).env == {
        "PYTHONPATH": "/srv"
    }
    assert "LD_PRELOAD" in refusal({"argv": ["true"], "env": {"LD_PRELOAD": "x"}}, policy)


def test_ordinary_variables_pass_and_no_policy_refuses_nothing() -> None:
    assert command({"argv": ["true"], "env": {"LANG": "C", "LDAP_URI": "x"}}, Policy()).env
    # Without a policy any program runs (sh -c ...): refusing LD_PRELOAD would guard nothing.
    assert command({"argv": ["true"], "env": {"LD_PRELOAD": "x"}}, None).env == {"LD_PRELOAD": "x"}


def test_the_messages_name_the_policy_file_when_there_is_one() -> None:
    policy = Policy(source="/etc/pgqctl/policy.toml")
    assert refusal({"argv": ["true"], "env": {"LD_PRELOAD": "x"}}, policy).endswith(
        "--allow-env LD_PRELOAD or allow_env in /etc/pgqctl/policy.toml"
    )


# -- handlers only --------------------------------------------------------------


def test_handlers_only_refuses_a_kind_without_a_handler_whatever_its_payload() -> None:
    policy = Policy(handlers_only=True)
    reason = refusal({"argv": ["true"]}, policy, kind="report")
    assert reason == (
        "kind 'report' has no handler, and the policy runs only kinds that have one "
        "(handlers_only): give the worker --handler report=COMMAND"
    )
    handled = command({"argv": ["rm"]}, policy, kind="mail", handlers={"mail": ("/bin/mail",)})
    assert handled.argv == ("/bin/mail",)


def test_handlers_are_checked_once_at_start(jobs_dir: Path) -> None:
    policy = Policy(programs=(str(jobs_dir),))
    policy.check_handlers([("report", ("report",))], {"PATH": str(jobs_dir)})
    with pytest.raises(BadInput, match=r"^the handler of kind 'mail': program sh \("):
        policy.check_handlers([("mail", ("sh", "-c", "x"))], ENVIRON)
    with pytest.raises(BadInput, match=r"handlers_only.*the worker has none"):
        Policy(handlers_only=True).check_handlers([], ENVIRON)


# -- enqueue's check ------------------------------------------------------------


def test_enqueue_check_knows_the_handlers_of_the_file() -> None:
    policy = Policy(handlers_only=True, handlers=(("mail", ("/bin/mail",)),))
    check_policy({"to": "a@example.com"}, "mail", policy)
    with pytest.raises(PayloadRejected, match="kind 'report' has no handler"):
        check_policy({"to": "a@example.com"}, "report", policy)
    # Without handlers_only, a payload that is not a command is some handler's.
    check_policy({"to": "a@example.com"}, "report", Policy(programs=()))
    with pytest.raises(PayloadRejected, match="not on the policy's allowlist"):
        check_policy({"argv": ["true"]}, "report", Policy(programs=()))


# -- the file -------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return str(path)


def test_a_policy_file_is_read_whole(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'handlers_only = true\nprograms = ["/usr/local/lib/jobs/", "/usr/bin/convert"]\n'
        'allow_env = ["PYTHONPATH"]\n[handlers]\nresize = "/usr/bin/convert -quality 80"\n',
    )
    assert read_policy(path) == Policy(
        handlers_only=True,
        programs=("/usr/local/lib/jobs/", "/usr/bin/convert"),
        allow_env=frozenset({"PYTHONPATH"}),
        handlers=(("resize", ("/usr/bin/convert", "-quality", "80")),),
        source=path,
    )
    assert read_policy(write(tmp_path, "")) == Policy(source=path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("programs = [", "is not valid TOML: "),
        ("program = []", "unknown key 'program' (did you mean 'programs'?)"),
        ('programs = "/usr/bin"', "programs must be an array of strings"),
        ('programs = ["bin/report"]', "'bin/report' is not an absolute path"),
        ('handlers_only = "yes"', "handlers_only must be true or false"),
        ('allow_env = ["LD_PRELOAD="]', "'LD_PRELOAD=' is not a variable name"),
        ("handlers = 1", "handlers must be a table"),
        ('[handlers]\nmail = ""', "handler 'mail' must be a command line"),
        ('[handlers]\nmail = "x \'y"', "handler 'mail': No closing quotation"),
    ],
)
def test_a_malformed_policy_file_is_one_line_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as caught:
        read_policy(path)
    assert str(caught.value).startswith(f"policy file {path}")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_policy_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"cannot read policy file .*: No such file"):
        read_policy(str(tmp_path / "none.toml"))


def test_flags_add_to_the_file_and_no_rule_means_no_policy() -> None:
    assert with_flags(None) is None
    base = Policy(programs=("/a",), allow_env=frozenset({"X"}), source="p.toml")
    combined = with_flags(base, handlers_only=True, programs=["/b"], allow_env=["Y"])
    assert combined == Policy(
        handlers_only=True, programs=("/a", "/b"), allow_env=frozenset({"X", "Y"}), source="p.toml"
    )
    assert with_flags(None, allow_env=["PATH"]) == Policy(allow_env=frozenset({"PATH"}))
    with pytest.raises(BadInput, match="--allow-program: 'jobs' is not an absolute path"):
        with_flags(None, programs=["jobs"])


def test_the_docs_list_every_loader_variable() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text()
    [row] = [line for line in docs.splitlines() if line.startswith("| loader variables")]
    listed = set(re.findall(r"`([A-Z_][A-Z0-9_]*)\*?`", row))
    assert listed == LOADER_VARIABLES | {prefix.rstrip("_") + "_" for prefix in LOADER_PREFIXES}


def test_a_program_name_with_a_line_end_stays_on_one_line(jobs_dir: Path) -> None:
    policy = Policy(programs=(str(jobs_dir),))
    assert refusal({"argv": ["sh\nCRITICAL fake"]}, policy).startswith(
        'command not found: "sh\\nCRITICAL fake"'
    )
    odd = jobs_dir.parent / "odd\nname"
    odd.write_text("#!/bin/sh\n")
    odd.chmod(0o755)
    assert f'program "{jobs_dir.parent}/odd\\nname" is not on' in refusal(
        {"argv": [str(odd)]}, policy
    )
