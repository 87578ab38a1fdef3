"""The host's status page in a real headless Chromium (Debian's chromium and chromium-driver, driven over WebDriver
by tests/webdriver.py) against a real `reconciler run` on the real engine, with real fake-vLLM lanes on a real
tmpfs: log in (a wrong token refused and audited), every slot and lane of the demo seen, a lane switch approved on
the page and watched through its phases live without a reload, a blocked plan shown with its holder, an orphan
offload file reclaimed after its confirm step, no console error and no Content-Security-Policy violation.

With PAGE_SCREENSHOTS=1 the test writes the page in each state (converged, switching, blocked, orphan) to
docs/page/*.png, the README's pictures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import REPO, LoopProcess, Root, wait_until
from webdriver import Browser, browser_paths

pytestmark = [pytest.mark.docker, pytest.mark.root]

A, B = "dark-compute-a", "dark-compute-b"
TOKEN = "t0ken-for-the-page-tests-" + "y" * 16
SHOTS = REPO / "docs" / "page"


def shot(browser: Browser, name: str) -> None:
    if os.environ.get("PAGE_SCREENSHOTS") == "1":
        browser.screenshot(SHOTS / f"{name}.png")


@pytest.fixture
def browser() -> Iterator[Browser]:
    if browser_paths() is None:
        # As the engine's tests do (tests/conftest.py): a failure where the tests must run (make test, CI), a skip
        # on a developer's box without a browser.
        why = "chromium and chromedriver are needed (.ci/setup-host installs them: chromium chromium-driver)"
        if os.environ.get("RECONCILER_REQUIRE_DOCKER") == "1" or os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    b = Browser()
    try:
        yield b
    finally:
        b.close()


def phases(b: Browser) -> dict[str, str]:
    """Each lane card's data-phase, by recipe (one read of the live DOM)."""
    got = b.script(
        "return Array.from(document.querySelectorAll('[data-lane]')).map(e => [e.dataset.lane, e.dataset.phase])"
    )
    return {lane: phase for lane, phase in got}


def states(b: Browser) -> dict[str, str]:
    got = b.script(
        "return Array.from(document.querySelectorAll('[data-slot]')).map(e => [e.dataset.slot, e.dataset.state])"
    )
    return {slot: state for slot, state in got}


def verdict(b: Browser) -> str | None:
    return b.attr("#verdict", "data-verdict")


def problems(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    """Console entries that are errors or CSP reports (Chromium logs a violation as SEVERE, source security)."""
    return [
        e
        for e in entries
        if e.get("level") in ("SEVERE", "WARNING") or "Content Security Policy" in str(e.get("message"))
    ]


def approve_plan(b: Browser, base: str) -> str:
    """Review the plan on the page and apply it by its id; a plan made stale meanwhile (another test's container
    on the shared engine changes every plan's fingerprint) is reviewed again. Returns the flash's outcome."""
    for _ in range(6):
        b.submit("#review-plan", to="/page/plan")
        plan_id = b.text("#plan-id")
        assert len(plan_id) == 32, plan_id
        b.submit("#apply", to=base + "/")
        outcome = b.attr("#flash", "data-outcome")
        if outcome != "stale":
            return str(outcome)
    raise AssertionError("every plan went stale before it was applied")


def test_the_page_in_a_real_browser(root: Root, tmp_path: Path, image: str, browser: Browser) -> None:
    t0 = time.monotonic()
    omni = root.recipe("omni")
    wide = root.recipe("deepseek-256k-offload", offload_mib=24, mode="start-delay=3")
    root.write_manifest_text(
        f"host: {root.host}\ntopology: split\ntopologies:\n"
        f"  split:\n    - recipe: {omni}\n      gpus: [{B}]\n"
        f"  exclusive:\n    - recipe: {wide}\n      gpus: [{A}, {B}]\n"
    )
    tf = tmp_path / "ops-token"
    tf.write_text(TOKEN + "\n")
    tf.chmod(0o600)
    # A debounce of some seconds: after an edit on the page the loop waits, so the plan the page approves is the one
    # that runs (the loop's own pass after it finds nothing to do). No resync in the test's time.
    lp = LoopProcess(root, "--api-token-file", str(tf), "--debounce", "6", "--resync", "600")
    try:
        lp.wait("pass", result="converged", timeout=60)
        base = f"http://{lp.addr}"
        b = browser

        # Log in: a wrong token is refused (401, audited as a failed login of the web front-end), the right one opens
        # a session; the token is never in a URL.
        b.get(base + "/")
        assert b.url == base + "/page/login"
        # The form says where the token is and that nothing else of the tool asks for it: a look-alike form served by
        # another user on the loop's port while it was down reads otherwise (docs/design.md, "Threat model").
        where = b.text("#token-where")
        assert f"The token is in the file {tf} on this host" in where and "nowhere else" in where, where
        assert "NOT BOUND" in b.text("#token-check"), b.text("#token-check")
        b.type("#token", "wrong-" + TOKEN[6:])
        b.submit("#login-submit", to="/page/login")
        assert "Wrong token" in b.text("#login-error")
        login_log = b.console()
        assert [e for e in problems(login_log) if "401" not in str(e["message"])] == [], login_log
        b.type("#token", TOKEN)
        b.submit("#login-submit", to=base + "/")
        assert TOKEN not in b.url
        b.wait(lambda: phases(b).get(omni) == "serving", timeout=30, what="omni serving")
        b.script("window.__sameDocument = 'never reloaded'")  # gone if the page ever reloads

        # Every slot and lane of the demo.
        assert states(b) == {A: "free", B: "serving"}, states(b)
        assert verdict(b) == "converged"
        assert root.host in b.text("#verdict")
        shot(b, "converged")

        # Switch to the exclusive lane on the page and approve its plan: the lanes go through their phases live.
        b.select("#topology", "exclusive")
        b.submit("#switch", to=base + "/")
        assert b.attr("#flash", "data-outcome") == "switched"
        b.script("window.__sameDocument = 'never reloaded'")
        b.wait(lambda: verdict(b) == "converging", timeout=5, what="the pending plan within 2 s")
        assert approve_plan(b, base) in ("running", "converged")
        b.script("window.__sameDocument = 'never reloaded'")
        seen: list[tuple[str, str]] = []

        def converged_wide() -> bool:
            now = phases(b)
            for lane, phase in now.items():
                if not seen or seen[-1] != (lane, phase):
                    seen.append((lane, phase))
            if now.get(wide) == "entering" and not any(n == "switching" for n in shot_taken):
                shot(b, "switching")
                shot_taken.append("switching")
            return now.get(wide) == "serving" and omni not in now

        shot_taken: list[str] = []
        b.wait(converged_wide, timeout=60, what=f"{wide} serving", every=0.05)
        assert (wide, "entering") in seen, seen
        assert seen.index((wide, "entering")) < seen.index((wide, "serving")), seen
        assert b.script("return window.__sameDocument") == "never reloaded", "the phases came without a reload"
        assert states(b) == {A: "serving", B: "serving"}
        b.wait(lambda: verdict(b) == "converged", timeout=10, what="converged again")

        # Back to the split, approved on the page. Then blocked: a container the tool does not own holds slot a, and
        # the exclusive plan, asked for again, shows the holder and the fix; the split needs only b.
        b.select("#topology", "split")
        b.submit("#switch", to=base + "/")
        assert approve_plan(b, base) in ("running", "converged")
        b.wait(lambda: phases(b) == {omni: "serving"}, timeout=60, what="omni back")
        b.wait(lambda: verdict(b) == "converged", timeout=10, what="converged on split")
        holder = root.run_unmanaged("holder", "-e", f"NVIDIA_VISIBLE_DEVICES={root.slot_index[A]}", *sleeper(image))
        b.select("#topology", "exclusive")
        b.submit("#switch", to=base + "/")
        b.wait(lambda: verdict(b) == "blocked", timeout=5, what="blocked within 2 s")
        assert holder in b.text("#plan"), b.text("#plan")
        assert states(b)[A] == "blocked"
        shot(b, "blocked")
        passes = lp.healthz()[1]["passes"]
        b.select("#topology", "split")
        b.submit("#switch", to=base + "/")
        b.wait(lambda: verdict(b) == "converged", timeout=5, what="converged on split again")
        # The loop's own look after the edits (debounced): nothing left for it to do.
        wait_until(lambda: lp.healthz()[1]["passes"] > passes, timeout=30, what="the loop's pass after the edits")

        # An orphan offload file appears: shown within 2 s, reclaimed only after the confirm step.
        orphan = root.shm / "vllm_offload_crashed.mmap"
        orphan.write_bytes(b"\xab" * (2 << 20))
        b.wait(lambda: b.attr("#shm", "data-orphans") == "1", timeout=5, what="the orphan within 2 s")
        assert str(orphan) in b.text("#shm")
        shot(b, "orphan")
        for _ in range(30):
            b.submit("#reclaim", to="/page/reclaim")
            assert str(orphan) in b.text(".would") and orphan.exists(), "the dry run removed nothing"
            b.submit("#confirm-reclaim", to=base + "/")
            if b.attr("#flash", "data-outcome") == "reclaimed":
                break
            # Safety rule 2 on an engine shared with other tests: while a native-offload lane of another root runs,
            # no file goes. That is the guard working; look again once it is gone.
            text = b.text("#flash")
            assert "native offload configured" in text and root.tag not in text, text
            time.sleep(1)
        assert b.attr("#flash", "data-outcome") == "reclaimed", b.text("#flash")
        assert not orphan.exists()
        b.wait(lambda: b.attr("#shm", "data-orphans") == "0", timeout=5, what="no orphan left")

        # A probe suite of the running lane, from the page.
        b.select("#probe-recipe", omni)
        b.submit("#probe", to=base + "/")
        assert b.attr("#flash", "data-outcome") == "probed" and "9/9 passed" in b.text("#flash"), b.text("#flash")

        # No console error and no CSP violation on any page; and the log would show one (an inline script is
        # refused and reported).
        assert problems(b.console()) == []
        b.script("var s = document.createElement('script'); s.textContent = '1'; document.body.appendChild(s)")
        reported = b.wait(lambda: problems(b.console()), timeout=5, what="the CSP report")
        assert "Content Security Policy" in str(reported[0]["message"]), reported

        # With JavaScript off the page is whole: the same login, the same cards and forms (it reloads itself).
        plain = Browser(javascript=False)
        try:
            plain.get(base + "/")
            plain.type("#token", TOKEN)
            plain.submit("#login-submit", to=base + "/")
            assert dict(plain.attrs("[data-slot]", "data-slot", "data-state")) == {A: "foreign", B: "serving"}
            assert dict(plain.attrs("[data-lane]", "data-lane", "data-phase")) == {omni: "serving"}
            assert plain.finds("#reclaim-form") and plain.finds("#switch-form") and plain.finds("#plan-form")
            assert problems(plain.console()) == []
        finally:
            plain.close()

        # The audit trail: the failed login, and each action of the web front-end with its caller.
        records = [r for r in root_audit(root) if r.get("front") == "web"]
        assert {"authenticate", "switch", "apply", "shm-reclaim", "probe"} <= {r["action"] for r in records}, records
        [failed] = [r for r in records if r["action"] == "authenticate"]
        assert failed["outcome"] == "refused" and failed["reason"] == "wrong token", failed
        assert all(r["who"] == "ops-token" for r in records if r["action"] != "authenticate"), records
        assert TOKEN not in lp.log()
    finally:
        lp.stop()
    assert time.monotonic() - t0 < 120


def sleeper(image: str) -> tuple[str, ...]:
    """``docker run`` arguments of a container that only sleeps (the host's /usr inside)."""
    return ("-v", "/usr:/usr:ro", image, "sleep", "300")


def root_audit(root: Root) -> list[dict[str, object]]:
    r = root.cli("audit", "--json")
    assert r.rc == 0, r
    return list(r.data["records"])
