"""HTTP client and strict Prometheus checker for the `refit serve` tests (serve_test.cc).

  serve_probe.py request METHOD URL [--token T] [--body TEXT]
      prints {"status": ..., "content_type": ..., "body": ...} as one JSON line
  serve_probe.py metrics (--url URL [--token T] | --file PATH)
      checks the exposition strictly and prints {"series": {"name{a=\"b\"}": value}} as one JSON
      line; a violation is one line on stderr and exit 1

The exposition must parse with prometheus_client's text parser and pass our own stricter checks:
HELP then TYPE once per family before its samples, every sample of a TYPE'd family, counters
named *_total, valid names, no duplicate series.
"""

import argparse
import json
import re
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 30
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def http(method, url, token=None, body=None):
    data = body.encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def fail(message):
    print("metrics: " + message, file=sys.stderr)
    sys.exit(1)


def parse_labels(text, line):
    labels, pos = [], 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        if not m:
            fail("bad labels in: " + line)
        labels.append((m.group(1), m.group(2)))
        pos = m.end()
    names = [n for n, _ in labels]
    if len(set(names)) != len(names):
        fail("a label given twice in: " + line)
    return labels


def strict_check(text):
    """Our checks, line by line; returns {series: value}."""
    if not text.endswith("\n"):
        fail("the exposition does not end with a newline")
    helped, typed, series = set(), {}, {}
    current = None
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            if name in helped or name in typed:
                fail("HELP of " + name + " twice or after its TYPE")
            helped.add(name)
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[3] not in ("counter", "gauge"):
                fail("bad TYPE line: " + line)
            name, kind = parts[2], parts[3]
            if not NAME.match(name) or name in typed:
                fail("bad or repeated TYPE of " + name)
            if name not in helped:
                fail("TYPE of " + name + " without a HELP before it")
            if kind == "counter" and not name.endswith("_total"):
                fail("counter " + name + " does not end in _total")
            typed[name], current = kind, name
        elif line.startswith("#") or not line:
            fail("unexpected line: " + repr(line))
        else:
            m = SAMPLE.match(line)
            if not m:
                fail("bad sample line: " + line)
            name = m.group(1)
            if name != current:
                fail("sample " + name + " is not under its own TYPE line")
            labels = parse_labels(m.group(3) or "", line)
            key = name + "{" + ",".join(f'{n}="{v}"' for n, v in sorted(labels)) + "}"
            if key in series:
                fail("duplicate series " + key)
            value = float(m.group(4))
            if typed[name] == "counter" and not value >= 0:
                fail("counter " + key + " is negative or NaN")
            series[key] = value
    return series


def check_metrics(text):
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends
        fail("prometheus_client cannot parse it: " + repr(e))
    for family in families:
        if family.type not in ("counter", "gauge"):
            fail("family " + family.name + " parsed as " + family.type)
    return strict_check(text)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    request = sub.add_parser("request")
    request.add_argument("method")
    request.add_argument("url")
    request.add_argument("--token")
    request.add_argument("--body")
    metrics = sub.add_parser("metrics")
    metrics.add_argument("--url")
    metrics.add_argument("--token")
    metrics.add_argument("--file")
    args = parser.parse_args()
    if args.command == "request":
        status, content_type, body = http(args.method, args.url, args.token, args.body)
        print(json.dumps({"status": status, "content_type": content_type, "body": body}))
        return
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    else:
        status, content_type, text = http("GET", args.url, args.token)
        if status != 200:
            fail(f"GET {args.url}: HTTP {status}")
        if not content_type.startswith("text/plain; version=0.0.4"):
            fail("content type " + content_type)
    print(json.dumps({"series": check_metrics(text)}))


if __name__ == "__main__":
    main()
