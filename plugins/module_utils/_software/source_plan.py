# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The source plan: every place a run fetches from, probed from the node before anything changes.

Each role that fetches contributes its sources in preflight (its ``sources`` entry point appends raw
entries to ``llmops_sources``); ``plan()`` turns them into one list - kind, URL, the URL probed, the
``llmops_mirrors`` key that replaces the source and the offline bundle entry that stages it - merging the
ones several roles need. ``have()`` says whether the node already has what a source would give (packages
installed, an image by digest, a verified model, a llama.cpp tree at the pin): those are not probed.
``probe_all()`` probes the rest concurrently under one deadline (TCP connect, then one HTTP(S) request; the
node's proxy variables for outside hosts, none for loopback); ``refusal()`` names every unreachable source
with its error and its way out.

The bundle entry names (``bundle_entry``) are defined here and nowhere else: the offline bundle helper and
docs/mirrors.md follow them.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import fnmatch
import os
import re
import socket
import threading
import time
from urllib import request as urlrequest
from urllib.error import HTTPError, URLError
from urllib.parse import urljoin, urlsplit, urlunsplit

from ansible_collections.llmops.serving.plugins.module_utils._download.http import is_loopback
from ansible_collections.llmops.serving.plugins.module_utils._software.image_reference import (
    registry_host,
    without_registry,
)

__metaclass__ = type


class SourcePlanError(Exception):
    """A source entry that cannot be planned (a role passed something malformed)."""


# kind -> the bundle folder that stages it. The single place of the offline bundle's layout.
BUNDLE_FOLDERS = {
    "yum": "packages",
    "apt": "packages",
    "pypi": "packages",
    "image": "images",
    "git": "git",
    "hf": "models",
    "modelscope": "models",
    "url": "models",
    "binary": "binaries",
}
KINDS = tuple(sorted(BUNDLE_FOLDERS))
# HTTP statuses that prove the source answers as what it is: a registry's /v2/ and a git remote may ask for
# credentials (401/403: reachable, the run brings them); a repository's metadata file must be there. A hub
# counts as reached by any answer short of a server error: mirrors implement its API unevenly, and whether
# the repo is there is the headers step's question (it names the repo and the file).
_ANSWERS = {
    "image": (200, 401, 403),
    "git": (200, 401, 403),
    "hf": tuple(range(200, 500)),
    "modelscope": tuple(range(200, 500)),
    # a model's own URL is probed without its signed query string (never sent anywhere but the download)
    "url": (200, 206, 401, 403),
}
_DEFAULT_ANSWERS = (200, 206)
# A redirect is followed, hop by hop (each routed as its own host needs): a GitHub release download answers
# 302 to objects.githubusercontent.com, a mirror may send its files to a CDN; the source is reached when the
# place it sends the client to answers.
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
# Docker Hub's registry API lives at registry-1.docker.io, whatever the image reference says.
_DOCKER_HUB = ("", "docker.io", "index.docker.io", "registry-1.docker.io")
_NAME_RE = re.compile(r"[^A-Za-z0-9._-]+")
PROXY_NAMES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


# The bundle entries of the sources outside the probe (the bootstrap stage's repositories, which it probes
# and rewrites itself before preflight): named here too, so that the bundle has one layout. The monitoring
# playbook's sources are planned like site.yml's (roles monitoring and monitoring_server, entry point
# sources).
OTHER_BUNDLE_ENTRIES = {
    "centos_vault": ("yum", "centos-vault"),
    "epel_archive": ("yum", "epel"),
}


def bundle_entry(kind, name):
    """The offline bundle's entry for a source: ``images/<name>``, ``git/llama.cpp``, ``models/<name>``,
    ``packages/<repo>``, ``binaries/<file>``."""
    if kind not in BUNDLE_FOLDERS:
        raise SourcePlanError("unknown source kind %r (one of %s)" % (kind, ", ".join(KINDS)))
    clean = _NAME_RE.sub("_", str(name)).strip("._") or "source"
    return "%s/%s" % (BUNDLE_FOLDERS[kind], clean)


def other_bundle_entry(key):
    """The bundle entry of a source outside the probe, by its llmops_mirrors key."""
    return bundle_entry(*OTHER_BUNDLE_ENTRIES[key])


def image_bundle_name(reference):
    """``registry/nvidia/cuda:12.4.1-devel@sha256:..`` -> ``nvidia_cuda_12.4.1-devel`` (what docker save
    of that image is called in the bundle; the registry and the digest are not part of the name)."""
    return without_registry(reference.split("@", 1)[0]).replace("/", "_").replace(":", "_")


def _expand(url):
    # yum's variables in a baseurl as yum fills them on an EL 7 x86_64 node; apt's $(ARCH) in a flat
    # repository's URI (the NVIDIA container toolkit's deb/$(ARCH)) as apt fills it on amd64
    return url.replace("$basearch", "x86_64").replace("$releasever", "7").replace("$(ARCH)", "amd64")


def probe_url(kind, url, extra=None):
    """The URL whose answer proves the source is reachable and is what it says."""
    extra = extra or {}
    base = url.rstrip("/")
    if kind == "yum":
        return _expand(base) + "/repodata/repomd.xml"
    if kind == "apt":
        suite = extra.get("suite") or ""
        return _expand(base) + ("/dists/%s/Release" % suite if suite else "/Release")
    if kind == "image":
        host = registry_host(url)
        if host in _DOCKER_HUB:
            return "https://registry-1.docker.io/v2/"
        scheme = "http" if is_loopback(host.rsplit(":", 1)[0].strip("[]")) else "https"
        return "%s://%s/v2/" % (scheme, host)
    if kind == "git":
        # a file:// remote is a repository on the node: its directory is what git needs
        # git:// (git daemon) is asked for the repository's refs in git's own protocol (_probe_git)
        return base if base.startswith(("file://", "git://")) else base + "/info/refs?service=git-upload-pack"
    if kind == "hf":
        return base + "/api/models/" + extra.get("repo", "")
    if kind == "modelscope":
        return base + "/api/v1/models/" + extra.get("repo", "")
    if kind == "pypi":
        return base + "/" + extra.get("package", "pip") + "/"
    return url


def _text(entry, field, required=True):
    value = entry.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise SourcePlanError("source entry %r has no %s" % (entry.get("name", entry), field))
        return ""
    return str(value).strip()


def hub_endpoint(kind, url, environ):
    """A hub source's endpoint as model_download resolves it: the entry's, else the node's environment
    (HF_ENDPOINT, MODELSCOPE_DOMAIN), else the hub's default."""
    from ansible_collections.llmops.serving.plugins.module_utils._download.options import HUBS
    hub = HUBS["huggingface" if kind == "hf" else "modelscope"]
    endpoint = url or (environ or {}).get(hub["endpoint_env"]) or hub["endpoint"]
    return (endpoint if "://" in endpoint else "https://" + endpoint).rstrip("/")


def plan(entries, environ=None):
    """One list of sources from the roles' raw entries. An entry: name, kind (KINDS), url (for an image: the
    reference), why (the role and stage that needs it), key (the llmops_mirrors key that replaces it; ''
    where none does), and optionally bundle (a name under the kind's bundle folder), suite (apt), repo (hubs),
    package (pypi), have (what on the node makes the source unnecessary: see have()). Entries that probe the
    same URL are one source needed for several reasons."""
    out = []
    by_probe = {}
    for entry in entries or []:
        if not isinstance(entry, dict):
            raise SourcePlanError("a source entry must be a mapping, got %r" % (entry,))
        kind = _text(entry, "kind")
        if kind not in BUNDLE_FOLDERS:
            raise SourcePlanError("source %r: unknown kind %r (one of %s)"
                                  % (entry.get("name"), kind, ", ".join(KINDS)))
        name = _text(entry, "name")
        if kind in ("hf", "modelscope"):
            url = hub_endpoint(kind, _text(entry, "url", required=False), environ)
        else:
            url = _text(entry, "url")
        bundle_name = entry.get("bundle") or (image_bundle_name(url) if kind == "image" else name)
        target = probe_url(kind, url, entry)
        why = _text(entry, "why")
        have_spec = entry.get("have") or {}
        merge_key = (kind, url if kind == "image" else target)
        if merge_key in by_probe:
            source = by_probe[merge_key]
            if why not in source["why"]:
                source["why"].append(why)
            # needed unless every role that needs it finds it on the node
            source["have"] = list(source["have"]) + [have_spec]
            continue
        source = {
            "name": name,
            "kind": kind,
            "url": url,
            "probe": target,
            "key": _text(entry, "key", required=False),
            "bundle": bundle_entry(kind, bundle_name),
            "why": [why],
            "have": [have_spec],
        }
        by_probe[merge_key] = source
        out.append(source)
    return out


# --- what the node has --------------------------------------------------------------------------------


def _run(runner, argv):
    try:
        return runner(argv)
    except OSError as exc:  # the command is not there (no docker, no git, no rpm)
        return 127, "", str(exc)


def packages_installed(specs, manager, runner):
    """Whether every package spec is installed: rpm specs ``name`` or ``name-version`` (rpm -q takes both),
    dpkg specs ``name`` or ``name=<version glob>``."""
    for spec in specs:
        if manager == "rpm":
            rc, out, err = _run(runner, ["rpm", "-q", spec])
            if rc != 0:
                return False
        elif manager == "dpkg":
            name, equals, version = spec.partition("=")
            rc, out, err = _run(runner, ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", name])
            status, space, installed = out.strip().partition(" ")
            if rc != 0 or status != "installed" or (version and not fnmatch.fnmatchcase(installed, version)):
                return False
        else:
            raise SourcePlanError("unknown package manager %r (rpm or dpkg)" % (manager,))
    return True


def image_present(reference, runner, docker="docker"):
    """Whether the image is on the node (by digest when the reference has one: docker resolves
    repo@sha256:... only to that content)."""
    rc, out, err = _run(runner, [docker, "image", "inspect", "--format", "{{.Id}}", reference])
    return rc == 0


def git_tree_at(root, commit, runner):
    """Whether a checkout under root (root itself or one level below, as llama.cpp's build root keeps one
    tree per source) is at commit."""
    candidates = [root]
    try:
        candidates += sorted(os.path.join(root, d) for d in os.listdir(root))
    except OSError:
        return False
    for path in candidates:
        if not os.path.isdir(os.path.join(path, ".git")):
            continue
        rc, out, err = _run(runner, ["git", "-C", path, "rev-parse", "HEAD"])
        if rc == 0 and out.strip() == commit:
            return True
    return False


def model_verified(final, snapshot=False):
    """Whether the model is on the node verified: a file with a matching sidecar record (model_sidecar), or
    a snapshot link that points at a complete snapshot (snapshot_store.current)."""
    if snapshot:
        from ansible_collections.llmops.serving.plugins.module_utils._snapshot import store as snapshot_store
        try:
            return snapshot_store.current(snapshot_store.Layout(final)) is not None
        except Exception:  # a foreign directory or a broken link: the snapshot module decides, not this
            return False
    from ansible_collections.llmops.serving.plugins.module_utils._download.sidecar import recorded_sha256
    return recorded_sha256(final) is not None


def _have_one(spec, runner, manager):
    if not spec:
        return False
    checks = []
    if "packages" in spec:
        checks.append(packages_installed(spec["packages"], spec.get("manager") or manager, runner))
    if "image" in spec:  # a reference, or a list of references any one of which will do
        refs = spec["image"] if isinstance(spec["image"], list) else [spec["image"]]
        checks.append(any(image_present(ref, runner, spec.get("docker") or "docker") for ref in refs))
    if "git_tree" in spec:
        checks.append(git_tree_at(spec["git_tree"]["root"], spec["git_tree"]["commit"], runner))
    if "model" in spec:
        checks.append(model_verified(spec["model"], bool(spec.get("snapshot"))))
    if "file" in spec:
        checks.append(os.path.exists(spec["file"]))
    return bool(checks) and all(checks)


def have(source, runner, manager="rpm"):
    """Whether the node has what the source would give, for every role that needs it (a source one role
    still needs is probed)."""
    return all(_have_one(spec, runner, manager) for spec in source["have"])


# --- the offline bundle ----------------------------------------------------------------------------------


def repository_and_tag(reference):
    """``registry.lan:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04@sha256:..`` -> ``nvidia/cuda:12.4.1-runtime-
    ubuntu22.04``: what names an image whichever registry serves it (``:latest`` when the reference has no
    tag)."""
    ref = without_registry(reference.split("@", 1)[0])
    if ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def in_bundle(source, bundle):
    """The entry of the run's verified offline bundle that stages the source, or None. bundle: what
    bundle_verify returned (``entries``: the entry names; ``images``: [{name, refs}]; ``packages``: [{name,
    format}]). A package repository the node's package manager reads is staged by a bundle repository of its
    format (deb for apt, rpm for yum: the bundle role points the package manager at them); not one read inside
    a container image (the builder's apt never sees the node's repositories). An image by a bundle image saved
    under the same repository:tag, unless the run pins it by digest (a loaded image has no registry digest:
    the pull by digest would still go out). Anything else by its own entry (models/<name>, git/llama.cpp,
    binaries/<file>)."""
    if not bundle:
        return None
    kind = source["kind"]
    if kind in ("yum", "apt"):
        if any("image" in (spec or {}) for spec in source.get("have") or []):
            return None
        wanted = "deb" if kind == "apt" else "rpm"
        for repo in bundle.get("packages") or []:
            if repo.get("format") == wanted:
                return repo["name"]
        return None
    if kind == "image":
        if "@" in source["url"]:
            return None
        wanted = repository_and_tag(source["url"])
        for image in bundle.get("images") or []:
            if any(repository_and_tag(ref) == wanted for ref in image.get("refs") or []):
                return image["name"]
        return None
    return source["bundle"] if source["bundle"] in (bundle.get("entries") or []) else None


# --- probing -------------------------------------------------------------------------------------------


def parse_environment_file(text):
    """KEY=VALUE lines of /etc/environment (pam_env's format: optional quotes, no expansion)."""
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, equals, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def proxy_settings(environ, environment_file=None):
    """{scheme: proxy URL, 'no': no_proxy} as yum, docker and git on the node see them: the process
    environment, else /etc/environment (where CentOS boxes behind a proxy usually set it)."""
    merged = {}
    for source in (parse_environment_file(environment_file), environ or {}):
        for name, value in source.items():
            if name.lower() in PROXY_NAMES and value:
                merged[name.lower()] = value
    out = {}
    for scheme in ("http", "https"):
        value = merged.get(scheme + "_proxy") or merged.get("all_proxy")
        if value:
            out[scheme] = value
    if merged.get("no_proxy"):
        out["no"] = merged["no_proxy"]
    return out


def _bypass(host, no_proxy):
    if is_loopback(host):
        return True
    for item in (no_proxy or "").replace(" ", "").split(","):
        item = item.lstrip(".").lower()
        if item == "*" or (item and (host == item or host.endswith("." + item))):
            return True
    return False


def route(url, proxies):
    """(proxy URL or None, host, port) of the first hop of a request to url."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    proxy = None if _bypass(host, proxies.get("no")) else proxies.get(parts.scheme)
    return proxy, host, port


class _NoRedirect(urlrequest.HTTPRedirectHandler):
    """Hands a redirect back to probe_one (an HTTPError with its Location) instead of following it with the
    first hop's proxy: the next hop may be a host that needs another route."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _opener(proxy, scheme):
    # an explicit ProxyHandler: the proxy route() chose (none for loopback and no_proxy hosts), never
    # urllib's own reading of the module's environment
    return urlrequest.build_opener(urlrequest.ProxyHandler({scheme: proxy} if proxy else {}), _NoRedirect())


def _shown(url):
    """A URL as an error message shows it: without its query (a redirect's signed download URL carries
    credentials in it)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _recv(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _probe_git(url, parts, timeout):
    """A git:// remote (git daemon, port 9418): the request git fetch sends first (git-upload-pack of the
    path), answered by the first pkt-line of the refs, or by an ERR line (no such repository, not exported).
    git:// takes no HTTP proxy (git's own core.gitProxy is the site's business)."""
    host, port = parts.hostname or "", parts.port or 9418
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except (OSError, socket.error) as exc:
        return "TCP connect to %s:%s failed: %s" % (host, port, getattr(exc, "strerror", None) or exc)
    try:
        sock.settimeout(timeout)
        request = "git-upload-pack %s\0host=%s\0" % (parts.path or "/", parts.netloc)
        sock.sendall(("%04x%s" % (len(request) + 4, request)).encode("utf-8"))
        head = _recv(sock, 4).decode("ascii", "replace")
        if not re.match(r"[0-9a-f]{4}\Z", head):
            return "%s gave no git answer (%s)" % (url, repr(head) if head else "it closed the connection")
        payload = _recv(sock, min(max(int(head, 16) - 4, 0), 256)).decode("utf-8", "replace")
        if payload.startswith("ERR "):
            return "%s: the git server says %s" % (url, payload[4:].strip())
        return None
    except (OSError, socket.error) as exc:
        return "%s failed: %s" % (url, getattr(exc, "strerror", None) or exc)
    finally:
        sock.close()


def _request(url, shown, proxies, timeout):
    """One hop: (status, Location or None, error or None; errors name the URL as ``shown``). A TCP connect
    to the first hop (the host, or its proxy) first, then one GET of the first byte."""
    parts = urlsplit(url)
    proxy, host, port = route(url, proxies)
    through = " (through proxy %s)" % proxy if proxy else ""
    hop = urlsplit(proxy) if proxy else None
    hop_host, hop_port = (hop.hostname, hop.port or 80) if hop else (host, port)
    try:
        socket.create_connection((hop_host, hop_port), timeout=timeout).close()
    except (OSError, socket.error) as exc:
        what = "proxy %s:%s" % (hop_host, hop_port) if proxy else "%s:%s" % (host, port)
        lead = "" if shown == url else shown + ": "  # a hop a redirect sent the probe to names the redirect
        reason = getattr(exc, "strerror", None) or exc
        return None, None, "%sTCP connect to %s failed: %s" % (lead, what, reason)
    request = urlrequest.Request(url, headers={"Range": "bytes=0-0", "User-Agent": "llmops-source-probe"})
    location = None
    try:
        response = _opener(proxy, parts.scheme).open(request, timeout=timeout)
        status = response.getcode()
        response.close()
    except HTTPError as exc:
        status = exc.code
        location = exc.headers.get("Location") if exc.headers is not None else None
        exc.close()
    except (URLError, OSError, socket.error) as exc:
        reason = getattr(exc, "reason", exc)
        return None, None, "%s failed: %s%s" % (shown, reason, through)
    except Exception as exc:  # a malformed answer (http.client.BadStatusLine, ...)
        return None, None, "%s failed: %s" % (shown, exc)
    if status in _REDIRECTS and location:
        return status, urljoin(url, location.strip()), None
    return status, None, None


def probe_one(source, proxies, timeout):
    """None when the source answers as what it is, else the error in a few words. Redirects are followed
    (at most _MAX_REDIRECTS); the error then names the hop that failed."""
    url = source["probe"]
    parts = urlsplit(url)
    if parts.scheme == "file":
        return None if os.path.exists(parts.path) else "%s does not exist on the node" % parts.path
    if parts.scheme == "git":
        return _probe_git(url, parts, timeout)
    first = url
    for redirects in range(_MAX_REDIRECTS + 1):
        # the probe URL as it is (the roles give it without credentials); a hop it was sent to, without
        # its query (a signed download URL)
        shown = "%s (redirected to %s)" % (first, _shown(url)) if redirects else url
        scheme = urlsplit(url).scheme
        if scheme not in ("http", "https"):
            return "%scannot probe a %s:// URL (http, https, git or file only)" % (
                shown + ": " if redirects else "", scheme)
        status, location, error = _request(url, shown, proxies, timeout)
        if error:
            return error
        if location is None:
            break
        url = location
    else:
        return "%s: more than %d redirects (the last to %s)" % (first, _MAX_REDIRECTS, _shown(url))
    if status in _ANSWERS.get(source["kind"], _DEFAULT_ANSWERS):
        return None
    proxy = route(url, proxies)[0]
    return "%s answered HTTP %s%s" % (shown, status, " (through proxy %s)" % proxy if proxy else "")


def probe_all(sources, proxies, deadline):
    """{source name: error or None} for every source, concurrently; a probe without an answer when the
    deadline (seconds, all probes together) has passed is reported as such."""
    results = {}
    lock = threading.Lock()
    per_request = max(1.0, float(deadline))

    def work(source):
        error = probe_one(source, proxies, per_request)
        with lock:
            results[source["name"]] = error

    threads = []
    for source in sources:
        thread = threading.Thread(target=work, args=(source,), name="probe " + source["name"])
        thread.daemon = True  # a hung probe must not keep the module alive past the deadline
        thread.start()
        threads.append(thread)
    end = time.time() + float(deadline)
    for thread in threads:
        thread.join(max(0.0, end - time.time()))
    with lock:
        out = dict(results)
    for source in sources:
        if source["name"] not in out:
            out[source["name"]] = "no answer from %s within %ss" % (source["probe"], deadline)
    return out


def way_out(source):
    """What replaces an unreachable source."""
    ways = []
    if source["key"]:
        ways.append("set llmops_mirrors.%s to a mirror the node reaches" % source["key"])
    else:
        ways.append("no llmops_mirrors key replaces it")
    ways.append("or stage %s of the offline bundle" % source["bundle"])
    return " ".join(ways)


def refusal(unreachable, node):
    """The failure message: every unreachable source, its error, who needs it and what replaces it."""
    lines = ["%d source(s) this run needs cannot be reached from %s; nothing was changed on the node:"
             % (len(unreachable), node)]
    for source, error in unreachable:
        lines.append("- %s (%s %s): %s; needed by %s; %s." % (
            source["name"], source["kind"], source["url"], error, ", ".join(source["why"]), way_out(source)))
    lines.append("Fix the mirrors (inventory llmops_mirrors, docs/mirrors.md) and rerun, or set "
                 "llmops_source_probe: false to skip this check.")
    return "\n".join(lines)


def report(sources):
    """One line per source for the run's output: kind, name, URL and its state."""
    return ["%s %s %s: %s" % (s["kind"], s["name"], s["url"], s["error"] or s["state"]) for s in sources]
