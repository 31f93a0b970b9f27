#!/usr/bin/env python3
"""Checks that the deployment files agree with the real smla-server.

Kubernetes (deploy/k8s, both variants: the AMD base and the nvidia/ overlay, whose JSON
patches are applied here), the Dockerfiles and the compose files are parsed, and checked
against `smla-server --helpfull` (every flag they pass exists), against each other (ports,
probe ports, Service target ports, Prometheus annotations, GPU resource names, termination
grace longer than the drain) and against a running server started with their config files
(the config parses and resolves, the probes' health service names answer SERVING, /metrics
is served at the annotated path, SIGTERM exits within the termination grace).

Usage: deploy_test.py --source DIR --server SMLA_SERVER --probe SMLA_HEALTH_PROBE
"""

import argparse
import copy
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import yaml

ARGS = None

# Queue drain before the grace period starts: bounded queues on a GPU empty in well under
# this; it is the margin the termination grace must leave beyond preStop + shutdown_grace_s.
DRAIN_MARGIN_S = 10
# A startup probe must allow at least this long for pool allocation and the warm-up launch.
MIN_STARTUP_S = 120
SMALL_MODEL = "--model=glm-5.3-flash:tp=8:page_rows=16:pool=16MiB"


class ComposeLoader(yaml.SafeLoader):
    """YAML loader that accepts compose's `!reset` merge tag."""


def _construct_reset(loader, node):
    if isinstance(node, yaml.SequenceNode):
        return {"__reset__": loader.construct_sequence(node, deep=True)}
    if isinstance(node, yaml.MappingNode):
        return {"__reset__": loader.construct_mapping(node, deep=True)}
    return {"__reset__": None}


ComposeLoader.add_constructor("!reset", _construct_reset)


def server_flags():
    out = subprocess.run([ARGS.server, "--helpfull"], capture_output=True, text=True,
                         check=False)
    flags = set(re.findall(r"^\s+--([A-Za-z_][A-Za-z0-9_]*)", out.stdout + out.stderr, re.M))
    if "listen" not in flags or "config" not in flags:
        raise AssertionError("smla-server --helpfull lists no --listen/--config: "
                             + (out.stdout + out.stderr)[:500])
    return flags


def flag_name(arg):
    m = re.match(r"^--(?:no)?([A-Za-z_][A-Za-z0-9_]*)(=.*)?$", arg)
    return m.group(1) if m else None


def flags_in(args):
    """Flag names of an argument list (values given as the next argument are skipped)."""
    return [flag_name(a) for a in args if a.startswith("--")]


def flag_value(args, name):
    for i, a in enumerate(args):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(args):
            return args[i + 1]
    return None


def textproto_field(text, name):
    m = re.search(rf"^\s*{name}\s*:\s*\"?([^\"\n]*)\"?\s*$", text, re.M)
    return m.group(1) if m else None


def port_of(host_port):
    return int(host_port.rsplit(":", 1)[1])


def json_pointer_tokens(path):
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def apply_json_patch(doc, ops):
    """The JSON-patch subset kustomize overlays use here: add, remove, replace."""
    doc = copy.deepcopy(doc)
    for op in ops:
        tokens = json_pointer_tokens(op["path"])
        parent = doc
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        key = int(last) if isinstance(parent, list) else last
        if op["op"] == "remove":
            del parent[key]
        elif op["op"] == "replace":
            parent[key]  # must exist
            parent[key] = op["value"]
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(key, op["value"])
            else:
                parent[key] = op["value"]
        else:
            raise AssertionError(f"unsupported patch op {op['op']}")
    return doc


def load_kustomization(directory):
    """Renders a kustomization of plain resources and JSON6902 patches (what deploy/k8s
    uses) into a list of objects."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    objects = []
    for r in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(path):
            objects += load_kustomization(path)
        else:
            with open(path) as f:
                objects += [d for d in yaml.safe_load_all(f) if d]
    for p in k.get("patches", []):
        ops = yaml.safe_load(p["patch"])
        target = p["target"]
        hits = [i for i, o in enumerate(objects)
                if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        if len(hits) != 1:
            raise AssertionError(f"patch target {target} matches {len(hits)} objects")
        objects[hits[0]] = apply_json_patch(objects[hits[0]], ops)
    return objects


def one(objects, kind, name=None):
    hits = [o for o in objects if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]
    if len(hits) != 1:
        raise AssertionError(f"{len(hits)} objects of kind {kind} name {name}")
    return hits[0]


def read_dockerfile(path):
    """Instructions of a Dockerfile as (KEYWORD, rest), continuation lines joined."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


class RunningServer:
    """smla-server with a deployment's config file and flags, on the deployment's listen
    hosts (start-up rules depend on them, e.g. what may be served beyond loopback) but free
    ports, and on the CPU backend with a small model."""

    def __init__(self, config_text, extra_args):
        self.dir = tempfile.TemporaryDirectory()
        self.config = os.path.join(self.dir.name, "server.textproto")
        with open(self.config, "w") as f:
            f.write(config_text)
        args = [a for a in extra_args if flag_name(a) not in
                ("config", "backend", "listen", "metrics_listen", "model", "token_file")]
        if flag_value(extra_args, "token_file"):
            # The deployment's secret, here a test token, in the server's file format.
            tokens = os.path.join(self.dir.name, "tokens")
            with open(tokens, "w") as f:
                f.write("deploy-test-token deploy-test-tenant\n")
            args.append(f"--token_file={tokens}")
        hosts = {}
        for name in ("listen", "metrics_listen"):
            value = flag_value(extra_args, name) or textproto_field(config_text, name)
            hosts[name] = value.rsplit(":", 1)[0] if value else "127.0.0.1"
        self.proc = subprocess.Popen(
            [ARGS.server, f"--config={self.config}", *args, f"--listen={hosts['listen']}:0",
             f"--metrics_listen={hosts['metrics_listen']}:0", "--backend=cpu",
             "--cpu_threads=1", SMALL_MODEL],
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir.name, "log"), "w"),
            text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on \S+:(\d+) \(metrics \S+:(\d+)", line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not start with the config: {line!r} {self.log()}")
        self.port, self.metrics_port = int(m.group(1)), int(m.group(2))

    def log(self):
        with open(os.path.join(self.dir.name, "log")) as f:
            return f.read()[-2000:]

    def probe(self, service):
        r = subprocess.run([ARGS.probe, f"127.0.0.1:{self.port}", service],
                           capture_output=True, text=True, timeout=30, check=False)
        return r.returncode, r.stdout.strip() + r.stderr.strip()

    def terminate(self):
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"no exit 120 s after SIGTERM: {self.log()}")
        self.proc.stdout.close()
        self.dir.cleanup()
        return rc, time.monotonic() - start

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()


class KubernetesTest(unittest.TestCase):
    variants = {
        # directory: (GPU resource, --backend, image tag)
        "deploy/k8s": ("amd.com/gpu", "hip", "rocm"),
        "deploy/k8s/nvidia": ("nvidia.com/gpu", "cuda", "cuda"),
    }

    @classmethod
    def setUpClass(cls):
        cls.flags = server_flags()

    def render(self, variant):
        return load_kustomization(os.path.join(ARGS.source, variant))

    def test_variants(self):
        for variant, (resource, backend, image) in self.variants.items():
            with self.subTest(variant=variant):
                self.check_variant(self.render(variant), resource, backend, image)

    def check_variant(self, objects, resource, backend, image):
        sts = one(objects, "StatefulSet")
        pod = sts["spec"]["template"]
        spec = pod["spec"]
        self.assertEqual(len(spec["containers"]), 1)
        c = spec["containers"][0]
        self.assertIn(image, c["image"])
        args = c.get("args", [])
        self.assertFalse(c.get("command"), "the image's ENTRYPOINT (smla-server) must run")

        # Every flag exists in the server.
        for name in flags_in(args):
            self.assertIn(name, self.flags, f"--{name} is not a smla-server flag")
        self.assertEqual(flag_value(args, "backend"), backend)

        # One GPU per server, of the variant's vendor, and no other GPU resource.
        limits = c["resources"]["limits"]
        gpus = {k: v for k, v in limits.items() if k.endswith("/gpu")}
        self.assertEqual(gpus, {resource: 1})

        # The config file comes from the ConfigMap through a mount.
        config_path = flag_value(args, "config")
        self.assertIsNotNone(config_path)
        mount = [m for m in c["volumeMounts"]
                 if config_path.startswith(m["mountPath"].rstrip("/") + "/")]
        self.assertEqual(len(mount), 1, f"no mount holds {config_path}")
        volume = [v for v in spec["volumes"] if v["name"] == mount[0]["name"]][0]
        cm = one(objects, "ConfigMap", volume["configMap"]["name"])
        key = config_path[len(mount[0]["mountPath"].rstrip("/")) + 1:]
        self.assertIn(key, cm["data"])
        config = cm["data"][key]
        self.assertIsNone(textproto_field(config, "backend"),
                          "the backend is a flag per variant, not in the shared config")

        # Ports: config <-> container ports <-> probes <-> Services <-> scrape annotations.
        listen = textproto_field(config, "listen")
        metrics_listen = textproto_field(config, "metrics_listen")
        self.assertTrue(listen.startswith("0.0.0.0:"), "pods must listen beyond loopback")
        self.assertTrue(metrics_listen.startswith("0.0.0.0:"))
        grpc_port, metrics_port = port_of(listen), port_of(metrics_listen)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports, {"grpc": grpc_port, "metrics": metrics_port})
        ann = pod["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(int(ann["prometheus.io/port"]), metrics_port)
        self.assertEqual(ann["prometheus.io/path"], "/metrics")
        probes = {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
        for kind, probe in probes.items():
            self.assertIn("grpc", probe, f"{kind} must be a native gRPC probe")
            self.assertEqual(probe["grpc"]["port"], grpc_port, kind)
        startup = probes["startupProbe"]
        self.assertGreaterEqual(startup["periodSeconds"] * startup["failureThreshold"],
                                MIN_STARTUP_S)

        # Termination grace covers preStop + drain + the server's shutdown grace.
        grace = int(textproto_field(config, "shutdown_grace_s") or 10)
        pre_stop = 0
        hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if hook:
            self.assertEqual(os.path.basename(hook[0]), "sleep")
            pre_stop = int(hook[1])
        self.assertGreater(spec["terminationGracePeriodSeconds"],
                           pre_stop + DRAIN_MARGIN_S + grace)

        # Secrets: the TLS one mounted at /etc/smla/tls; the token file, when given, comes
        # from a secret that is not optional (a pod without tokens must not start).
        secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        mounts = {m["mountPath"].rstrip("/"): m["name"] for m in c["volumeMounts"]}
        self.assertIn(mounts.get("/etc/smla/tls"), secrets)
        token_file = flag_value(args, "token_file")
        if token_file:
            volume = mounts.get(os.path.dirname(token_file))
            self.assertIn(volume, secrets, f"{token_file} is not in a mounted secret")
            self.assertFalse(secrets[volume].get("optional", False))

        # Services: a headless one (the StatefulSet's) for DNS scale-out, a regular one;
        # both select the pods and reach the gRPC port.
        labels = pod["metadata"]["labels"]
        services = [o for o in objects if o["kind"] == "Service"]
        headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
        regular = [s for s in services if s["spec"].get("clusterIP") != "None"]
        self.assertEqual(len(headless), 1)
        self.assertGreaterEqual(len(regular), 1)
        self.assertEqual(sts["spec"]["serviceName"], headless[0]["metadata"]["name"])
        self.assertFalse(headless[0]["spec"].get("publishNotReadyAddresses", False))
        for s in services:
            for k, v in s["spec"]["selector"].items():
                self.assertEqual(labels.get(k), v, s["metadata"]["name"])
            for p in s["spec"]["ports"]:
                target = p.get("targetPort", p["port"])
                self.assertIn(target if isinstance(target, int) else ports[target],
                              (grpc_port, metrics_port))
            self.assertIn(grpc_port, [ports[p["targetPort"]] if isinstance(p["targetPort"], str)
                                      else p["targetPort"] for p in s["spec"]["ports"]])

        # The real server accepts the config, answers every probe's service name, serves
        # the annotated metrics path, and exits 0 on SIGTERM within the termination grace.
        server = RunningServer(config, args)
        try:
            for kind, probe in probes.items():
                rc, out = server.probe(probe["grpc"].get("service", ""))
                self.assertEqual(rc, 0, f"{kind} service {probe['grpc'].get('service')!r}: {out}")
            rc, out = server.probe("no.such.Service")
            self.assertNotEqual(rc, 0, "an unregistered health service must not be SERVING")
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.metrics_port}{ann['prometheus.io/path']}",
                    timeout=10) as r:
                self.assertEqual(r.status, 200)
                self.assertIn("smla_", r.read().decode())
            rc, seconds = server.terminate()
            self.assertEqual(rc, 0)
            self.assertLess(seconds, spec["terminationGracePeriodSeconds"])
        finally:
            server.kill()


class ContainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flags = server_flags()
        with open(os.path.join(ARGS.source, "deploy/server.textproto")) as f:
            cls.config = f.read()
        cls.grpc_port = port_of(textproto_field(cls.config, "listen"))
        cls.metrics_port = port_of(textproto_field(cls.config, "metrics_listen"))

    def test_image_defaults_start_the_server(self):
        # The image's default config with its default flags (CMD).
        ins = read_dockerfile(os.path.join(ARGS.source, "Dockerfile"))
        server = RunningServer(self.config, yaml.safe_load([r for w, r in ins if w == "CMD"][-1]))
        try:
            rc, out = server.probe("")
            self.assertEqual(rc, 0, out)
            self.assertEqual(server.terminate()[0], 0)
        finally:
            server.kill()

    def check_dockerfile(self, path, backend, arch_arg, arch):
        ins = read_dockerfile(os.path.join(ARGS.source, path))
        words = [w for w, _ in ins]
        self.assertGreaterEqual(words.count("FROM"), 2, "multi-stage")
        text = "\n".join(f"{w} {r}" for w, r in ins)
        self.assertIn(f"ARG {arch_arg}={arch}", text)
        run = [r for w, r in ins if w == "RUN" and "scripts/container_build.sh" in r]
        self.assertEqual(len(run), 1, "the build stage runs scripts/container_build.sh")
        build = shlex.split(run[0])
        self.assertEqual(flag_value(build, "backend"), backend)
        self.assertEqual(flag_value(build, "arch"), "${%s}" % arch_arg)
        prefix = flag_value(build, "prefix")
        self.assertIn(f"COPY --from=build {prefix} {prefix}", text)
        self.assertIn("runtime-packages.txt", text)

        user = [r for w, r in ins if w == "USER"]
        self.assertEqual(len(user), 1)
        self.assertNotIn(user[0], ("root", "0"))
        exposed = {int(p) for w, r in ins if w == "EXPOSE" for p in r.split()}
        self.assertEqual(exposed, {self.grpc_port, self.metrics_port})

        entry = [r for w, r in ins if w == "ENTRYPOINT"]
        self.assertEqual(len(entry), 1)
        self.assertEqual(yaml.safe_load(entry[0]), [f"{prefix}/bin/smla-server"])
        cmd = yaml.safe_load([r for w, r in ins if w == "CMD"][-1])
        for name in flags_in(cmd):
            self.assertIn(name, self.flags)
        self.assertEqual(flag_value(cmd, "config"), f"{prefix}/share/smla/server.textproto")
        self.assertEqual(flag_value(cmd, "backend"), backend)

        health = [r for w, r in ins if w == "HEALTHCHECK"]
        self.assertEqual(len(health), 1)
        probe = yaml.safe_load(health[0][health[0].index("CMD") + 3:].strip())
        self.assertEqual(probe[0], f"{prefix}/bin/smla")
        self.assertEqual(probe[-1], "health")
        self.assertEqual(flag_value(probe, "server"), f"127.0.0.1:{self.grpc_port}")
        return text

    def test_rocm_dockerfile(self):
        text = self.check_dockerfile("Dockerfile", "hip", "GPU_ARCH", "gfx950")
        self.assertRegex(text, r"ARG ROCM_IMAGE=rocm/dev-ubuntu-24\.04:7\.")
        self.assertRegex(text, r"--groups video,render")

    def test_cuda_dockerfile(self):
        text = self.check_dockerfile("deploy/cuda/Dockerfile", "cuda", "CUDA_ARCH", "90a")
        self.assertRegex(text, r"ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13\.0\.\d+-devel-ubuntu24\.04")
        self.assertRegex(text,
                         r"ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13\.0\.\d+-runtime-ubuntu24\.04")

    def test_compose(self):
        def load(name):
            with open(os.path.join(ARGS.source, "deploy", name)) as f:
                return yaml.load(f, Loader=ComposeLoader)

        for files, backend in ((["compose.yaml"], "hip"),
                               (["compose.yaml", "compose.cuda.yaml"], "cuda")):
            with self.subTest(files=files):
                doc = load(files[0])
                for extra in files[1:]:
                    for name, over in load(extra)["services"].items():
                        doc["services"][name].update(over)
                server = doc["services"]["smla-server"]
                demo = doc["services"]["smla-demo"]
                cmd = server["command"]
                for name in flags_in(cmd):
                    self.assertIn(name, self.flags)
                self.assertEqual(flag_value(cmd, "backend"), backend)
                published = {p.rsplit(":", 1)[1] for p in server["ports"]}
                self.assertEqual(published, {str(self.grpc_port), str(self.metrics_port)})
                test = server["healthcheck"]["test"]
                self.assertEqual(test[0], "CMD")
                self.assertEqual(test[-1], "health")
                self.assertEqual(flag_value(test, "server"), f"127.0.0.1:{self.grpc_port}")
                grace = int(textproto_field(self.config, "shutdown_grace_s"))
                self.assertGreater(int(server["stop_grace_period"].rstrip("s")),
                                   grace + DRAIN_MARGIN_S)
                self.assertEqual(demo["image"], server["image"])
                self.assertEqual(demo["command"][-1], "demo")
                self.assertEqual(flag_value(demo["command"], "server"),
                                 f"smla-server:{self.grpc_port}")
                self.assertEqual(demo["depends_on"]["smla-server"]["condition"],
                                 "service_healthy")
                # The server's flags, with the config, start a server.
                running = RunningServer(self.config, cmd)
                try:
                    self.assertEqual(running.terminate()[0], 0)
                finally:
                    running.kill()


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--probe", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v", *rest])


if __name__ == "__main__":
    main()
