"""How the HTTP API holds many clients: tandemd's resident memory with 1,000
idle keep-alive connections, then with 200 concurrent streams on top, and
whether /health still answers promptly under that load (a thread per
connection is what made llama.cpp's server fail its health checks).

  python3 bench/http_connections.py --tandemd=build/bin/tandemd --model=MODEL.gguf

Prints one line per phase: RSS (VmRSS) and peak (VmHWM) in MiB, the health
check's latency, and how many streams finished with [DONE]. Standard library
only; needs `ulimit -n` above 1,300."""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def health_ms(port):
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/health")
    status = connection.getresponse().status
    connection.close()
    return status, (time.perf_counter() - start) * 1000


def stream(port, model, max_tokens, results, index):
    body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Count to {index}."}]})
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        connection.request("POST", "/v1/chat/completions", body,
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
        results[index] = response.status == 200 and text.rstrip().endswith("data: [DONE]")
        connection.close()
    except OSError:
        results[index] = False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandemd", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--max_tokens", type=int, default=32)
    args = parser.parse_args()

    grpc_port, metrics_port, http_port = free_port(), free_port(), free_port()
    daemon = subprocess.Popen(
        [args.tandemd, f"--model={args.model}", f"--listen=127.0.0.1:{grpc_port}",
         f"--metrics_listen=127.0.0.1:{metrics_port}", f"--http_port={http_port}",
         "--max_queued_requests=1024"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.time() + 120
        while True:
            try:
                if health_ms(http_port)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > end or daemon.poll() is not None:
                sys.exit("tandemd did not start")
            time.sleep(0.2)
        model = json.loads(urllib_get(http_port, "/v1/models"))["data"][0]["id"]
        print(f"ready: RSS {rss_mib(daemon.pid):.0f} MiB")

        idle = []
        for _ in range(args.idle):
            connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            connection.request("GET", "/health")
            connection.getresponse().read()  # answered; the connection stays open
            idle.append(connection)
        status, ms = health_ms(http_port)
        print(f"{len(idle)} idle keep-alive connections: RSS {rss_mib(daemon.pid):.0f} MiB; "
              f"health {status} in {ms:.1f} ms")

        results = [None] * args.streams
        threads = [threading.Thread(target=stream,
                                    args=(http_port, model, args.max_tokens, results, i))
                   for i in range(args.streams)]
        for t in threads:
            t.start()
        worst_health, samples = 0.0, []
        while any(t.is_alive() for t in threads):
            status, ms = health_ms(http_port)
            if status != 200:
                worst_health = float("inf")
            worst_health = max(worst_health, ms)
            samples.append(rss_mib(daemon.pid))
            time.sleep(0.2)
        for t in threads:
            t.join()
        print(f"+{args.streams} concurrent streams of {args.max_tokens} tokens: "
              f"{sum(1 for r in results if r)} finished with [DONE]; RSS max "
              f"{max(samples):.0f} MiB, peak (VmHWM) {rss_mib(daemon.pid, 'VmHWM'):.0f} MiB; "
              f"health always 200, worst {worst_health:.1f} ms")
        status, ms = health_ms(http_port)
        print(f"after: RSS {rss_mib(daemon.pid):.0f} MiB, {len(idle)} idle connections still "
              f"open; health {status} in {ms:.1f} ms")
        for connection in idle:
            connection.close()
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def urllib_get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path)
    body = connection.getresponse().read().decode()
    connection.close()
    return body


if __name__ == "__main__":
    main()
