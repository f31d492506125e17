"""Hostile actions on the local desktop: each fails in the specific expected way and the host is untouched.

One sandboxed desktop serves the module (its start costs ~1.5 s); the test that kills every
process of the desktop runs last and checks that the next reset brings a fresh one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import uuid

import pytest

from rz_agents.envs.osworld.client import ServerError
from rz_agents.envs.osworld.desktop_env import DesktopEnv
from rz_agents.envs.osworld.providers import sandbox
from rz_agents.envs.osworld.providers.local import SOURCE_ROOT, episode_pids, free_port
from rz_agents.envs.osworld.setup_steps import step_launch

pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and sandbox.bwrap_problem() is None),
    reason="needs xvfb and a working bubblewrap (scripts/install.sh installs them)",
)

SECRET = f"rz-secret-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def env():
    os.environ["RZ_TEST_DESKTOP_SECRET"] = SECRET  # the host's environment when the desktop starts
    e = DesktopEnv(require_screenshot=False, require_a11y_tree=False)
    try:
        e.reset(None)
        assert e.provider.desktop.sandboxed
        yield e
    finally:
        e.close()
        del os.environ["RZ_TEST_DESKTOP_SECRET"]


def inside(env: DesktopEnv, code: str):
    """Run ``code`` as an agent action in the desktop; the JSON it printed last."""
    result = env.ctx.client.run_python(code)
    assert result["returncode"] == 0, result
    return json.loads(result["output"].strip().splitlines()[-1])


TRY_WRITE = """
import json, os
out = {}
for path in PATHS:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        out[path] = 0
    except OSError as exc:
        out[path] = exc.errno
print(json.dumps(out))
"""


def test_the_system_is_read_only_and_only_home_and_tmp_take_writes(env, tmp_path):
    python_dir = sandbox.python_dirs()[0]
    canary = f"rz_pwned_{uuid.uuid4().hex[:8]}"
    expected = {
        f"/etc/{canary}": errno.EROFS,
        f"/usr/{canary}": errno.EROFS,
        f"/usr/local/{canary}": errno.EROFS,
        f"{python_dir}/{canary}": errno.EROFS,
        f"{sandbox.PACKAGE_DIR}/rz_agents/{canary}": errno.EROFS,
        f"{sandbox.BIN_DIR}/{canary}": errno.EROFS,
        f"/{canary}": errno.EACCES,  # the sandbox's own root, owned by root
        f"/home/{canary}": errno.EACCES,
        f"/root/{canary}": errno.EACCES,
        f"/var/{canary}": errno.EACCES,
        f"/home/user/Desktop/{canary}": 0,
        f"/tmp/{canary}": 0,
    }
    got = inside(env, f"PATHS = {list(expected)!r}\n" + TRY_WRITE)
    assert got == expected
    unlink = inside(
        env,
        "import os, json\ntry:\n os.remove('/etc/hostname')\nexcept OSError as e:\n"
        " print(json.dumps(e.errno))",
    )
    assert unlink == errno.EROFS
    # On the host: nothing outside the episode's folder; the home file is inside it.
    host_paths = [
        f"/etc/{canary}", f"/usr/{canary}", f"/usr/local/{canary}", f"{python_dir}/{canary}",
        f"{SOURCE_ROOT}/rz_agents/{canary}", f"/{canary}", f"/home/{canary}", f"/root/{canary}",
        f"/var/{canary}", f"/tmp/{canary}",
    ]  # fmt: skip
    assert [p for p in host_paths if os.path.exists(p)] == []
    assert os.path.isfile(os.path.join(env.provider.desktop.home_dir, "Desktop", canary))
    assert os.path.exists("/etc/hostname")


def test_host_files_and_environment_are_invisible(env, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    code = f"""
import glob, json, os
def listing(p):
    try:
        return sorted(os.listdir(p))
    except OSError as exc:
        return exc.errno
def read(p):
    try:
        return open(p).read()
    except OSError as exc:
        return exc.errno
environs = []
for p in glob.glob('/proc/*/environ'):
    try:
        environs.append(open(p, 'rb').read().decode(errors='replace'))
    except OSError:
        pass
print(json.dumps({{
    "secret_file": read({str(secret_file)!r}),
    "root": listing('/root'), "home": listing('/home'), "run": listing('/run'), "work": listing('/work'),
    "run_user": listing('/run/user'), "runtime": os.path.realpath('/run/user/1000'),
    "var": listing('/var'), "shadow": read('/etc/shadow'),
    "env_has_secret": {SECRET!r} in repr(dict(os.environ)) or any({SECRET!r} in e for e in environs),
    "environs_read": len(environs),
}}))
"""
    got = inside(env, code)
    assert got["secret_file"] == errno.ENOENT
    # /root holds only the way down to the Python installation, when that lives there.
    python_under_root = {d.split("/")[2] for d in sandbox.python_dirs() if d.startswith("/root/")}
    assert got["root"] == sorted(python_under_root)
    assert got["home"] == ["user"] and got["work"] == errno.ENOENT
    # /run is the desktop's own: only the VM user's runtime folder, a link into its own /tmp
    assert got["run"] == ["user"] and got["run_user"] == ["1000"] and got["runtime"] == "/tmp/.xdg-runtime"
    assert set(got["var"]) <= {"cache", "lib", "tmp"}
    if os.path.exists("/etc/shadow"):
        assert got["shadow"] == errno.EACCES
    assert got["environs_read"] >= 3 and got["env_has_secret"] is False


def test_the_desktop_user_has_no_privileges(env):
    code = """
import json, os, subprocess
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines() if ':' in line)
sudo = subprocess.run('echo password | sudo -S id -u', shell=True, capture_output=True, text=True)
nested = subprocess.run(['unshare', '--user', 'true'], capture_output=True, text=True)
print(json.dumps({"uid": os.getuid(), "user": os.environ.get("USER"), "cap_eff": status['CapEff'].strip(),
                  "no_new_privs": status['NoNewPrivs'].strip(), "sudo_uid": sudo.stdout.strip(),
                  "nested_userns": [nested.returncode, nested.stderr.strip()]}))
"""
    got = inside(env, code)
    assert got["uid"] != 0 and got["user"] == "user" and got["sudo_uid"] == str(got["uid"])
    assert got["cap_eff"] == "0000000000000000" and got["no_new_privs"] == "1"
    if os.geteuid() == 0:  # the seccomp filter of a root host; else bubblewrap's --disable-userns
        assert got["nested_userns"][0] != 0 and "Operation not permitted" in got["nested_userns"][1]


def test_network_reaches_only_the_desktops_own_loopback(env):
    host_listener = socket.socket()
    host_listener.bind(("127.0.0.1", 0))
    host_listener.listen(1)
    host_listener.settimeout(0.5)
    host_port = host_listener.getsockname()[1]
    page_port = free_port()  # free on the host; inside, the desktop serves a page on it
    code = f"""
import json, socket
out = {{}}
for name, target in (("host_loopback", ("127.0.0.1", {host_port})), ("internet", ("1.1.1.1", 80))):
    try:
        socket.create_connection(target, timeout=3).close()
        out[name] = 0
    except OSError as exc:
        out[name] = exc.errno
try:
    socket.getaddrinfo("example.com", 80)
    out["dns"] = 0
except socket.gaierror as exc:
    out["dns"] = exc.errno
print(json.dumps(out))
"""
    try:
        got = inside(env, code)
        with pytest.raises(TimeoutError):
            host_listener.accept()  # nothing from the desktop reached the host's port
    finally:
        host_listener.close()
    assert got["host_loopback"] == errno.ECONNREFUSED  # the desktop's loopback is its own
    assert got["internet"] == errno.ENETUNREACH
    assert got["dns"] in (socket.EAI_AGAIN, socket.EAI_NONAME)  # no resolver is reachable

    # Chromium: a page served on the desktop's loopback opens; a remote one does not.
    inside(env, "open('/home/user/page.html', 'w').write('<title>served locally</title>')\nprint(1)")
    env.ctx.client.launch(
        ["python", "-m", "http.server", str(page_port), "--bind", "127.0.0.1", "--directory", "/home/user"]
    )
    step_launch(env.ctx, ["google-chrome", "about:blank"])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", page_port), timeout=2)  # the host cannot see it either

    def visit(browser):
        page = browser.contexts[0].pages[0]
        out = []
        for url in (f"http://127.0.0.1:{page_port}/page.html", "http://example.com/"):
            try:
                page.goto(url, timeout=15000)
                out.append(page.title())
            except Exception as exc:
                out.append(str(exc).splitlines()[0])
        return out

    local, remote = env.ctx.chrome.call(visit, timeout_s=60)
    assert local == "served locally"
    assert "net::ERR_INTERNET_DISCONNECTED" in remote


def test_killing_everything_reaches_only_the_desktop(env):
    victim = subprocess.Popen(["sleep", "300.5"])
    try:
        code = f"""
import json, os
pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]
cmdlines = [open(f'/proc/{{p}}/cmdline', 'rb').read().replace(b'\\0', b' ').decode() for p in pids]
out = {{"pids": pids, "victim_listed": any('300.5' in c for c in cmdlines)}}
for name, pid in (("victim", {victim.pid}), ("host_test", {os.getpid()})):
    try:
        os.kill(pid, 9)
        out[name] = 0
    except OSError as exc:
        out[name] = exc.errno
print(json.dumps(out))
"""
        got = inside(env, code)
        assert {victim.pid, os.getpid()}.isdisjoint(got["pids"]) and not got["victim_listed"]
        assert max(got["pids"]) < 1000  # its own PID namespace
        assert got["victim"] == errno.ESRCH and got["host_test"] == errno.ESRCH
        episode = env.provider.desktop.episode_id
        kill_all = (
            "import os, signal\nif os.getuid() != 0 and os.getpid() < 1000:\n    os.kill(-1, signal.SIGKILL)"
        )
        with pytest.raises(ServerError):  # the desktop's server dies with everything else in it
            env.ctx.client.run_python(kill_all)  # (guarded: never run by a root outside a PID namespace)
        assert victim.poll() is None  # the host's process lives on
        env.reset(None)  # a fresh desktop replaces the dead one
        assert episode_pids(episode) == []
        assert inside(env, "print(1)") == 1
    finally:
        victim.kill()
        victim.wait()
