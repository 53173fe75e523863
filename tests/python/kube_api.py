"""A fake Kubernetes API server for end-to-end tests of `strata operator`: kmock 0.8 plus the add-ons kube-rs needs.

This is a mock, not a cluster: there is no etcd, no admission, no schema validation, no controllers, no
scheduler, no garbage collection. It stores JSON objects in memory and serves them over the Kubernetes REST
paths well enough for kube-rs (`kube::Client`, `kube::runtime::Controller`, the finalizer helper and the event
`Recorder`) to run against it unchanged.

What kmock provides (PyPI `kmock`, pinned to 0.8 -- the add-ons below use its private `kmock._internal`
modules, and its author warns of breaking changes before 1.0): `KubernetesEmulator`, an aiohttp server that
parses Kubernetes paths, stores objects created with POST, serves GET / list / `?watch=true` (ADDED, MODIFIED,
DELETED as JSON lines), applies merge patches and RFC 6902 JSON patches, sets `deletionTimestamp` on a DELETE
of an object with finalizers and deletes it when the last finalizer goes, answers 409 on a duplicate create
and 404 on a missing object, and serves discovery for declared resources.

What this adapter adds, and why (each is a gap that breaks kube-rs or the operator's behaviour under test):

1. `metadata.resourceVersion` (one global counter, bumped on every write), `uid`, `creationTimestamp` and
   `generation`. kmock sets none of them; kube-runtime's watcher turns every watch event without a
   resourceVersion into `Error::NoResourceVersion` and relists, so a Controller never sees a usable event. The
   operator's job id also contains the uid. `apiVersion`/`kind` are filled in from the declared resource and
   `metadata.namespace` from the URL (kmock leaves an object created without them unreachable by namespaced
   watches), and `generateName` becomes a name (kmock answers 500).
2. Lists carry `apiVersion`, `kind: <Kind>List` and `metadata.resourceVersion` = the counter (kmock sends the
   literal `"..."`, which the watcher would then watch from).
3. A watch from `resourceVersion=N` does not replay objects whose resourceVersion is <= N (kmock replays
   everything as ADDED on every watch, which kube-runtime would see as fresh changes after each relist).
4. `/status` is a real subresource: a write to `.../status` changes only `.status`, a write to the object
   itself ignores `.status` (for resources declared with a status subresource), and `generation` goes up only
   when `spec` changes. kmock applies either to the whole object, so "status only when changed" and
   `observedGeneration` could not be tested.
5. 409 Conflict for a write that carries a stale `metadata.resourceVersion` (kmock stores it as sent).
6. JSON patch `test` of a missing path against `null` passes, as in the real API server (Go's json-patch);
   kube-runtime's finalizer helper adds the first finalizer with exactly that (`test /metadata/finalizers
   null`, then `add`), and Python's jsonpatch fails it (kmock then answers 500). A failed patch is 422
   `Invalid`, as in the real API server, instead of 500.
7. Cluster-scoped core resources: kmock's path parser reads `/api/v1/namespaces/NAME` as "namespace NAME,
   no resource" and fails on `POST /api/v1/namespaces`. The operator GETs `/api/v1/namespaces/NAME` for the
   team label, so the parser is wrapped to read `/api/v1/{namespaces,nodes,persistentvolumes}[/NAME[/status]]`
   as the cluster-scoped resource.
8. PUT (replace) and server-side-apply of a missing object (kmock: 404), label selectors on list and watch,
   and simple equality field selectors on list (kmock ignores selectors).

Still not like a real API server: no 410 Gone (any old resourceVersion is accepted), no BOOKMARK events,
`timeoutSeconds` is ignored (a watch lasts until the client drops it), an object deleted between a list and
the next watch gets no DELETED event (kmock keeps no event history), no ownerReference garbage collection,
timestamps are wall-clock seconds.

Use: `FakeKubeApi()` starts it as a child process (this file run as a script) on a free loopback port and
`stop()` ends it; `.client` is a `KubeClient` with small HTTP helpers; `kubeconfig(path)` writes a kubeconfig
pointing at it (plain HTTP, no auth). Every request is logged to the server's log file (`.log_path`).
"""
import asyncio
import datetime
import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

KMOCK_VERSION = "0.8"

# Every resource the operator (and these tests) touch. Declared up front: kmock answers a list of an
# undeclared resource that has no objects with 404, which would fail a watcher's initial list.
RESOURCES = {
    "strata.dev/v1alpha1/dataclaims": dict(kind="DataClaim", namespaced=True, subresources={"status"}),
    "strata.dev/v1alpha1/datasets": dict(kind="Dataset", namespaced=True, subresources={"status"}),
    "v1/namespaces": dict(kind="Namespace", namespaced=False, subresources={"status", "finalize"}),
    "events.k8s.io/v1/events": dict(kind="Event", namespaced=True),
    "coordination.k8s.io/v1/leases": dict(kind="Lease", namespaced=True),
    "v1/pods": dict(kind="Pod", namespaced=True, subresources={"status"}),
    "discovery.k8s.io/v1/endpointslices": dict(kind="EndpointSlice", namespaced=True),
}
CLUSTER_SCOPED_CORE = ("namespaces", "nodes", "persistentvolumes")


# ---------------------------------------------------------------------------------------------------------
# The server (runs in the child process; kmock is imported only there and by code that asks for it).

def _server_classes():
    import aiohttp.web
    import jsonpatch
    import jsonpointer
    import kmock
    from kmock._internal import dicts, enums, k8s, parsing

    if getattr(kmock, "__version__", KMOCK_VERSION).split(".")[:2] != KMOCK_VERSION.split("."):
        raise RuntimeError(f"kube_api.py is written against kmock {KMOCK_VERSION}, found {kmock.__version__}")

    # 7. Cluster-scoped core resources (rendering.Request._parse calls parsing.parse_path through the module).
    original_parse_path = parsing.parse_path
    cluster_path = re.compile(r"^/api/v1/(%s)(?:/([^/]+)(?:/(status|finalize))?)?/?$" % "|".join(CLUSTER_SCOPED_CORE))

    def parse_path(path):
        m = cluster_path.match(path)
        if m:
            return parsing.ParsedPath(group="", version="v1", plural=m[1], namespace=None, name=m[2],
                                      subresource=m[3])
        return original_parse_path(path)

    if not getattr(parsing.parse_path, "_strata_cluster_scoped", False):
        parse_path._strata_cluster_scoped = True
        parsing.parse_path = parse_path

    def now():
        return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def rv_of(obj):
        try:
            return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
        except (ValueError, AttributeError):
            return 0

    def match_labels(sel, labels):
        """Equality- and set-based label selectors: k=v, k==v, k!=v, k in (a,b), k notin (a,b), k, !k."""
        for term in re.split(r",(?![^()]*\))", sel or ""):
            term = term.strip()
            if not term:
                continue
            if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
                k, op, vals = m[1], m[2], {v.strip() for v in m[3].split(",")}
                if (op == "in") != (labels.get(k) in vals):
                    return False
            elif "!=" in term:
                k, v = term.split("!=", 1)
                if labels.get(k.strip()) == v.strip():
                    return False
            elif "=" in term:
                k, v = term.replace("==", "=").split("=", 1)
                if labels.get(k.strip()) != v.strip():
                    return False
            elif term.startswith("!"):
                if term[1:] in labels:
                    return False
            elif term not in labels:
                return False
        return True

    def conflict(msg):
        return k8s.KubernetesError(status=409, reason="Conflict", message=msg)

    def invalid(msg):
        return k8s.KubernetesError(status=422, reason="Invalid", message=msg)

    def pointer_exists(doc, path):
        try:
            jsonpointer.resolve_pointer(doc, path)
            return True
        except jsonpointer.JsonPointerException:
            return False

    class StatefulEmulator(kmock.KubernetesEmulator):
        """kmock's emulator with resourceVersions, a real status subresource and the other add-ons above."""

        _rv = 0  # the instance's counter shadows this on first write

        def _next_rv(self):
            self._rv += 1
            return str(self._rv)

        def _api_version(self, res):
            return (f"{res.group}/" if res.group else "") + res.version

        def _info(self, res):
            return self.resources[res] if res in self.resources else None

        def _has_status(self, res):
            info = self._info(res)
            return info is not None and "status" in info.subresources

        async def __call__(self, raw_request):
            # One log line per request (and the error body for failures): what the operator asked, and what
            # it got, for a test's failure report.
            t = time.time()
            if raw_request.query.get("watch") == "true":
                print(f"{t:.3f} {raw_request.method} {raw_request.path_qs} (watch starts)", file=sys.stderr, flush=True)
            resp = await super().__call__(raw_request)
            status = getattr(resp, "status", "?")
            line = f"{time.time():.3f} {raw_request.method} {raw_request.path_qs} -> {status}"
            if isinstance(status, int) and status >= 400:
                body = getattr(resp, "text", None) or ""
                try:
                    b = json.loads(body)
                    body = json.dumps({k: b.get(k) for k in ("reason", "message")})
                except ValueError:
                    pass
                line += f" {body[:500]}"
                if raw_request.method in ("POST", "PUT", "PATCH"):
                    line += f" request body: {(await raw_request.text())[:500]}"
            print(line, file=sys.stderr, flush=True)
            return resp

        async def _handle(self, request):
            res, act = request.resource, request.action
            if res is None or res.plural is None:
                return await super()._handle(request)
            key = (res, request.namespace, request.name)
            stored = self._objects[key] if key in self._objects and not self._objects[key].deleted else None
            ctype = next((v for k_, v in request.headers.items() if k_.lower() == "content-type"), "")
            data = request.data
            if act == enums.action.CREATE and isinstance(data, dict):                       # 1.
                data["apiVersion"] = data.get("apiVersion") or self._api_version(res)
                info = self._info(res)
                if info is not None and info.kind and not data.get("kind"):
                    data["kind"] = info.kind
                md = data.setdefault("metadata", {})
                if request.namespace:
                    md["namespace"] = request.namespace
                if not md.get("name") and md.get("generateName"):
                    md["name"] = md["generateName"] + secrets.token_hex(3)
                md.update(uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion=self._next_rv(),
                          generation=1)
                md.pop("deletionTimestamp", None)
                if request.subresource is None and self._has_status(res):
                    pass  # a create may carry a status (kube-rs never sends one); kept, as real servers drop it
            elif request.method == "PUT" and request.name and isinstance(data, dict):       # 8. replace
                if stored is None:
                    raise k8s.KubernetesObjectNotFoundError()
                want = (data.get("metadata") or {}).get("resourceVersion")
                if want and want != stored["metadata"].get("resourceVersion"):
                    raise conflict(f"the object has been modified (resourceVersion {want} is stale)")
                old = stored.raw
                old_md = old["metadata"]
                if request.subresource == "status":
                    data = dict(old, status=data.get("status"))
                else:
                    if self._has_status(res):
                        data = dict(data)
                        if "status" in old:
                            data["status"] = old["status"]
                        else:
                            data.pop("status", None)
                    md = dict(data.get("metadata") or {})
                    for f in ("uid", "creationTimestamp", "deletionTimestamp", "namespace", "generation"):
                        if f in old_md:
                            md[f] = old_md[f]
                    if data.get("spec") != old.get("spec"):
                        md["generation"] = old_md.get("generation", 1) + 1
                    data["metadata"] = md
                data.setdefault("apiVersion", old.get("apiVersion"))
                data.setdefault("kind", old.get("kind"))
                data["metadata"] = dict(data["metadata"], resourceVersion=self._next_rv())
                async with self._lock:
                    stored.create(data)
                    await self._buses[res].put({"type": "MODIFIED", "object": stored.raw})
                return aiohttp.web.json_response(stored.raw)
            elif act == enums.action.UPDATE and request.name:
                if stored is None and "apply-patch" in ctype and isinstance(data, dict):     # 8. SSA create
                    data.setdefault("apiVersion", self._api_version(res))
                    md = data.setdefault("metadata", {})
                    md.update(name=request.name, uid=str(uuid.uuid4()), creationTimestamp=now(),
                              resourceVersion=self._next_rv(), generation=1)
                    if request.namespace:
                        md["namespace"] = request.namespace
                    async with self._lock:
                        self._objects[key] = data
                        await self._buses[res].put({"type": "ADDED", "object": self._objects[key].raw})
                    return aiohttp.web.json_response(self._objects[key].raw, status=201)
                if stored is not None:
                    old = stored.raw
                    if isinstance(data, dict):                                              # merge patch
                        want = (data.get("metadata") or {}).get("resourceVersion")
                        if want and want != old["metadata"].get("resourceVersion"):         # 5.
                            raise conflict(f"the object has been modified (resourceVersion {want} is stale)")
                        if request.subresource == "status":                                 # 4.
                            keep = {"status": data.get("status")}
                            data.clear()
                            data.update(keep)
                        else:
                            if self._has_status(res):
                                data.pop("status", None)
                            if isinstance(data.get("spec"), dict) and isinstance(old.get("spec"), dict):
                                if dicts.merge_patch_dict(old["spec"], data["spec"]) != old["spec"]:
                                    data.setdefault("metadata", {})["generation"] = \
                                        old["metadata"].get("generation", 1) + 1
                        data.setdefault("metadata", {})
                        if data["metadata"] is None:
                            data["metadata"] = {}
                        data["metadata"]["resourceVersion"] = self._next_rv()
                    elif isinstance(data, list):                                            # JSON patch
                        ops = []
                        for op in data:
                            if not isinstance(op, dict):
                                raise invalid(f"not a JSON patch operation: {op!r}")
                            if op.get("op") == "test" and op.get("value") is None \
                                    and not pointer_exists(old, op.get("path", "")):        # 6.
                                continue
                            if op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion" \
                                    and op.get("value") != old["metadata"].get("resourceVersion"):
                                raise conflict("the object has been modified (resourceVersion test failed)")
                            ops.append(op)
                        try:
                            patched = jsonpatch.apply_patch(old, ops, in_place=False)
                        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                            raise invalid(f"the JSON patch could not be applied: {e}")
                        if request.subresource == "status":
                            ops = [{"op": "replace" if "status" in old else "add", "path": "/status",
                                    "value": patched.get("status")}]
                        else:
                            if self._has_status(res) and patched.get("status") != old.get("status"):
                                # as the real server: the object's own endpoint ignores .status
                                ops.append({"op": "add", "path": "/status", "value": old["status"]}
                                           if "status" in old else {"op": "remove", "path": "/status"})
                            if patched.get("spec") != old.get("spec"):
                                ops.append({"op": "add", "path": "/metadata/generation",
                                            "value": old["metadata"].get("generation", 1) + 1})
                        ops.append({"op": "add", "path": "/metadata/resourceVersion", "value": self._next_rv()})
                        data[:] = ops
            elif act == enums.action.DELETE and stored is not None:
                md = stored["metadata"]
                if md.get("finalizers") and not md.get("deletionTimestamp"):
                    async with self._lock:
                        stored.patch({"metadata": {"deletionTimestamp": now(), "deletionGracePeriodSeconds": 0,
                                                   "resourceVersion": self._next_rv()}})
                        await self._buses[res].put({"type": "MODIFIED", "object": stored.raw})
            try:
                return await super()._handle(request)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise invalid(f"the patch could not be applied: {e}")

        def _selected(self, request, obj):
            """Whether `obj` passes the request's labelSelector and (equality) fieldSelector."""
            md = obj.get("metadata") or {}
            if not match_labels(request.params.get("labelSelector"), md.get("labels") or {}):
                return False
            for term in filter(None, request.params.get("fieldSelector", "").split(",")):
                neg = "!=" in term
                f, v = term.split("!=" if neg else "=", 1)
                o = obj
                for p in f.strip().split("."):
                    o = (o or {}).get(p) if isinstance(o, dict) else None
                if (str(o) == v.lstrip("=")) == neg:
                    return False
            return True

        async def _serve_list(self, request):
            result = await super()._serve_list(request)                                     # 2.
            items = sorted((o for o in result["items"] if self._selected(request, o)), key=rv_of)
            res = request.resource
            info = self._info(res)
            kind = (info.kind if info is not None and info.kind else res.plural.capitalize()) + "List"
            return {"apiVersion": self._api_version(res), "kind": kind,
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}

        async def _serve_watch(self, request):
            # Replaces kmock's: it snapshots the objects and only then subscribes to the event bus, so a
            # write in between was never streamed. Here the bus position is marked under the same lock that
            # every write holds, and objects at or below the requested resourceVersion are not replayed (3.).
            yield b""  # the headers go out now, even if nothing happens for a while
            since = int(request.params.get("resourceVersion") or 0)
            res = request.resource
            bus = self._buses[res]

            def wanted(obj):
                md = obj.get("metadata") or {}
                return ((request.namespace is None or md.get("namespace") == request.namespace)
                        and (request.name is None or md.get("name") == request.name)
                        and self._selected(request, obj))

            async with self._lock:
                marker = await bus.mark()
                current = [obj.raw for (r, _, _), obj in self._objects.items() if r == res and not obj.deleted]
            try:
                for raw in sorted(current, key=rv_of):
                    if wanted(raw) and not (since and rv_of(raw) <= since):
                        yield {"type": "ADDED", "object": raw}
                async for ev in bus.stream(since=marker):
                    if isinstance(ev, dict) and wanted(ev.get("object") or {}):
                        yield ev
            finally:
                await bus.unmark(marker)

    return StatefulEmulator


async def _serve(host, port):
    import kmock
    emulator_cls = _server_classes()
    async with emulator_cls() as k, kmock.Server(k, host=host, port=port or None) as srv:
        for key, info in RESOURCES.items():
            k.resources[key] = kmock.ResourceInfo(**info)
        print(f"listening on {srv.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("stopping", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------
# The test side: start/stop the child, and plain HTTP helpers.

class KubeError(Exception):
    def __init__(self, method, path, status, body):
        super().__init__(f"{method} {path}: HTTP {status}: {body}")
        self.status, self.body = status, body


class KubeClient:
    """Plain-HTTP helpers against the fake API server (no auth). Paths are API paths (`/api/v1/...`)."""

    def __init__(self, url):
        self.url = url.rstrip("/")

    def request(self, method, path, body=None, content_type="application/json", timeout=10):
        """(status, decoded JSON body or text) of one request."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def _ok(self, method, path, body=None, content_type="application/json"):
        status, v = self.request(method, path, body, content_type)
        if status not in (200, 201, 202):
            raise KubeError(method, path, status, v)
        return v

    def create(self, path, obj):
        """POST `obj` to the collection `path`; the stored object."""
        return self._ok("POST", path, obj)

    def get(self, path):
        """The object at `path`, or None if there is none."""
        status, v = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise KubeError("GET", path, status, v)
        return v

    def list(self, path, label_selector=None):
        """The items of the collection `path`."""
        q = f"?labelSelector={urllib.parse.quote(label_selector)}" if label_selector else ""
        return self._ok("GET", path + q)["items"]

    def merge_patch(self, path, patch):
        return self._ok("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path):
        """DELETE `path`: the object as the server answered (with deletionTimestamp while finalizers hold it)."""
        return self._ok("DELETE", path)


def resource_path(group_version, plural, namespace=None, name=None, subresource=None):
    """`/api/v1/...` or `/apis/GROUP/VERSION/...` for a collection, an object or its subresource."""
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    p = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        p += f"/{name}"
    if subresource:
        p += f"/{subresource}"
    return p


def dataclaims(namespace=None, name=None, subresource=None):
    return resource_path("strata.dev/v1alpha1", "dataclaims", namespace, name, subresource)


def datasets(namespace=None, name=None, subresource=None):
    return resource_path("strata.dev/v1alpha1", "datasets", namespace, name, subresource)


def namespaces(name=None):
    return resource_path("v1", "namespaces", None, name)


def events(namespace):
    return resource_path("events.k8s.io/v1", "events", namespace)


def leases(namespace, name=None):
    return resource_path("coordination.k8s.io/v1", "leases", namespace, name)


def endpointslices(namespace, name=None):
    return resource_path("discovery.k8s.io/v1", "endpointslices", namespace, name)


class FakeKubeApi:
    """The fake API server in a child process on a free loopback port; `stop()` ends it."""

    def __init__(self, log_path=None, python=sys.executable, start_timeout=30):
        self.log_path = log_path or tempfile.mkstemp(prefix="kube-api-", suffix=".log")[1]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([python, "-u", os.path.abspath(__file__), "--host", "127.0.0.1", "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.time() + start_timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.time()
            if self.proc.poll() is not None or left <= 0:
                self.stop()
                raise RuntimeError(f"the fake Kubernetes API did not start:\n{self.log()}")
            r, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if r:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    continue
                line += chunk
        m = re.search(rb"listening on (http://\S+)", line)
        if not m:
            self.stop()
            raise RuntimeError(f"unexpected output from the fake Kubernetes API: {line!r}\n{self.log()}")
        self.url = m[1].decode().rstrip("/")
        self.port = urllib.parse.urlparse(self.url).port
        self.client = KubeClient(self.url)

    def kubeconfig(self, path):
        """Write a kubeconfig for this server (plain HTTP, no credentials) to `path`; returns `path`."""
        with open(path, "w") as f:
            f.write(f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {self.url}
users:
- name: fake
  user: {{}}
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
    namespace: default
current-context: fake
""")
        return path

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="A fake Kubernetes API server (kmock + add-ons) for tests.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    asyncio.run(_serve(a.host, a.port))
