"""A bounded schemathesis run over the agent's /openapi.json (request bodies and query parameters described
in it), as the administrator: no generated request may cause a server error."""

import os
import re
import subprocess

from conftest import ADMIN_TOKEN, VENV_BIN, Gateway


def test_schemathesis_finds_no_server_error(origin, tmp_path):
    gw = Gateway(origin)
    try:
        # Some data for the routes to act on.
        gw.client().put_object(Bucket="default", Key="fuzz/a.bin", Body=b"a" * 1000)
        out = subprocess.run(
            [os.path.join(VENV_BIN, "schemathesis"), "run", f"{gw.api}/openapi.json",
             "--checks", "not_a_server_error", "--max-examples", "50", "--seed", "19",
             "--phases", "examples,coverage,fuzzing", "--request-timeout", "20",
             "--generation-deterministic", "--workers", "1", "--no-color",
             # Not fuzzed: the two long-running ones (a full listing, a warm-up of everything)
             # and /v1/cleanup/purge (it would empty the trash other generated requests rely on).
             "--exclude-path-regex", "^/v1/(usage/scan|cleanup/purge)$",
             "-H", f"Authorization: Bearer {ADMIN_TOKEN}"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path)
        report = out.stdout[-6000:] + out.stderr[-2000:]
        assert out.returncode == 0, report
        m = re.search(r"(\d+) generated, (\d+) passed", out.stdout)
        assert m and int(m.group(1)) == int(m.group(2)) and int(m.group(1)) > 2000, report
        tested = re.search(r"Tested: (\d+)", out.stdout)
        assert tested and int(tested.group(1)) >= 50, report
    finally:
        gw.close()
