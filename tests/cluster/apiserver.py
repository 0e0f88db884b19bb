"""A stand-in for the Kubernetes API server: an in-memory store behind the REST paths the CLI uses.

There is no Kubernetes cluster (and no container engine to run one) on the machines these tests
run on. This server lets the real `kubernetes` client make its real HTTP calls (paths, query
parameters, JSON bodies, patch content types) and get answers shaped as the API server's: objects
with metadata filled in, `…List` kinds, `Status` errors with reason and message. It does not
schedule pods or run controllers; tests put the pods and events they need into `store`.

Only what the CLI calls is implemented: create, get, list (label and field selectors of
`key=value` terms), JSON-patch (`replace`), and delete, under /api/v1 and /apis/GROUP/VERSION,
plus the garbage collector's cascade: deleting an object deletes those whose ownerReferences
name its uid (as a Job expired by ttlSecondsAfterFinished takes its dependents along).
"""
from __future__ import annotations

import base64
import copy
import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PATH = re.compile(r"^/(api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
_KINDS = {"secrets": "Secret", "services": "Service", "persistentvolumeclaims":
          "PersistentVolumeClaim", "deployments": "Deployment", "jobs": "Job", "pods": "Pod",
          "events": "Event", "serviceaccounts": "ServiceAccount", "roles": "Role",
          "rolebindings": "RoleBinding"}


class FakeApiServer:
    def __init__(self) -> None:
        # (resource, namespace, name) -> object
        self.store: dict[tuple[str, str, str], dict[str, Any]] = {}
        # resource -> (HTTP status, reason, message): the next creates of it are refused so.
        self.refuse: dict[str, tuple[int, str, str]] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path?query, content type)
        self.lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def add(self, resource: str, namespace: str, obj: dict[str, Any]) -> None:
        """Puts an object (a pod, an event) as if a controller had made it."""
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", namespace)
        meta.setdefault("uid", str(uuid.uuid4()))
        self.store[(resource, namespace, meta["name"])] = obj

    def objects(self, resource: str, namespace: str) -> dict[str, dict[str, Any]]:
        return {name: obj for (r, ns, name), obj in self.store.items()
                if r == resource and ns == namespace}

    def kubeconfig(self, folder: Path, namespace: str | None = None) -> Path:
        context: dict[str, str] = {"cluster": "fake", "user": "tester"}
        if namespace:
            context["namespace"] = namespace
        path = folder / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "not-checked"}}],
            "contexts": [{"name": "fake", "context": context}]}))
        return path

    # -- HTTP ---------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def _serve(self) -> None:
                url = urlsplit(self.path)
                server.requests.append((self.command, self.path,
                                        self.headers.get("Content-Type", "")))
                match = _PATH.match(url.path)
                if not match:
                    return self._answer(*_status(404, "NotFound", f"no route {url.path}"))
                _, namespace, resource, name = match.groups()
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                with server.lock:
                    status, body = server._dispatch(self.command, resource, namespace, name,
                                                    query, self._body())
                self._answer(status, body)

            do_GET = do_POST = do_PATCH = do_DELETE = _serve

        return Handler

    def _dispatch(self, method: str, resource: str, namespace: str, name: str | None,
                  query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        kind = _KINDS.get(resource, resource)
        key = (resource, namespace, name or "")
        if method == "POST":
            if resource in self.refuse:
                return _status(*self.refuse[resource])
            name = body["metadata"]["name"]
            key = (resource, namespace, name)
            if key in self.store:
                return _status(409, "AlreadyExists", f'{resource} "{name}" already exists')
            obj = copy.deepcopy(body)
            meta = obj["metadata"]
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion="1",
                        creationTimestamp="2026-01-01T00:00:00Z")
            if kind == "Secret" and "stringData" in obj:  # as the API server stores it
                obj.setdefault("data", {}).update(
                    {k: base64.b64encode(v.encode()).decode()
                     for k, v in obj.pop("stringData").items()})
            self.store[key] = obj
            return 201, obj
        if name is None:  # list
            items = [o for (r, ns, _), o in self.store.items()
                     if r == resource and ns == namespace
                     and _matches(o.get("metadata", {}).get("labels", {}),
                                  query.get("labelSelector"))
                     and _matches(o, query.get("fieldSelector"))]
            return 200, {"apiVersion": "v1", "kind": f"{kind}List",
                         "metadata": {"resourceVersion": "1"}, "items": items}
        if key not in self.store:
            return _status(404, "NotFound", f'{resource} "{name}" not found')
        if method == "GET":
            return 200, self.store[key]
        if method == "PATCH":
            obj = self.store[key]
            for op in body:
                assert op["op"] == "replace", op
                *parents, leaf = op["path"].strip("/").split("/")
                target = obj
                for part in parents:
                    target = target[part]
                if leaf not in target:
                    return _status(422, "Invalid", f"path {op['path']} does not exist")
                target[leaf] = op["value"]
            return 200, obj
        if method == "DELETE":
            obj = self.store.pop(key)
            self._collect_garbage(namespace, obj["metadata"].get("uid"))
            return 200, obj
        return _status(405, "MethodNotAllowed", method)

    def _collect_garbage(self, namespace: str, uid: str | None) -> None:
        """What Kubernetes' garbage collector does after an owner is deleted (in the
        background): deletes the objects whose ownerReferences name it, and theirs in turn.
        (Not the real thing: it ignores blockOwnerDeletion and several owners.)"""
        owned = [k for k, o in self.store.items() if k[1] == namespace and any(
            r.get("uid") == uid for r in o.get("metadata", {}).get("ownerReferences") or ())]
        for key in owned:
            obj = self.store.pop(key)
            self._collect_garbage(namespace, obj["metadata"].get("uid"))

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(10)


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": message, "reason": reason, "code": code}


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    """`a=b,c=d` against labels (flat) or fields (dotted paths into the object)."""
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        found: Any = obj
        for part in [key] if key in obj else key.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if found != value:
            return False
    return True


@contextmanager
def fake_api_server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server
