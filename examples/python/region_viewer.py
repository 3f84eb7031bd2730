#!/usr/bin/python3
"""examples/python/region_viewer.py: a Python viewer of the atmosphere
example (examples/atmosphere/).  It subscribes to "atmosphere.field" with
the region modulator of examples/atmosphere/modulators.lua: the simulation
process keeps a latitude/longitude box and sends block means of it, so only
the box crosses the wire.  Every N steps it prints a summary line and, with
--out DIR, saves the field: a PNG heat map when Debian's python3-matplotlib
is installed, else a .npy file (NumPy).

    luajit examples/atmosphere/simulation.lua --steps 100 --wait 1 &   # prints "nameserver 127.0.0.1:PORT"
    PYTHONPATH=python python3 examples/python/region_viewer.py --nameserver 127.0.0.1:PORT --every 10

Options:
  --nameserver HOST:PORT  the name server (required)
  --box A,B,C,D           lat_min,lat_max,lon_min,lon_max (default 0,90,0,180)
  --stride N              block side in cells (default 2)
  --every N               report (and save) every N steps (default 10)
  --out DIR               save each reported field there (PNG, or .npy without matplotlib)
  --seconds S             stop after S seconds if the final event has not come by then (default 60)
Ends at the simulation's final event (or Ctrl-C)."""
import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # a checkout; harmless when installed

import lecho  # noqa: E402

try:
    import numpy as np
except ImportError:  # the summary lines need no NumPy
    np = None


def region_modulator():
    """The region modulator's Lua source, as the Lua viewer ships it."""
    text = open(os.path.join(HERE, "..", "atmosphere", "modulators.lua")).read()
    copy = re.search(r"local COPY = \[==\[(.*?)\]==\]", text, re.S)
    m = re.search(r"M\.region = COPY \.\. \[==\[(.*?)\]==\]", text, re.S)
    if not m or not copy:
        sys.exit("region_viewer: no M.region (COPY .. [==[...]==]) in examples/atmosphere/modulators.lua")
    return copy.group(1) + m.group(1)


def extent(ev):
    """The image's edges [west, east, south, north] in degrees: ev's lat0,
    lon0 are the first block's centre (examples/atmosphere/modulators.lua),
    so the edges are half a block out from the first and last centres."""
    lat0, lon0 = ev.get("lat0", 0), ev.get("lon0", 0)
    west, south = lon0 - ev["dlon"] / 2, lat0 - ev["dlat"] / 2
    return [west, west + ev["dlon"] * ev["nlon"], south, south + ev["dlat"] * ev["nlat"]]


def limits(ev):
    """The axes' ranges (lon, lat), each None to keep the image's: the box
    asked for (ev.region), since the blocks' edges reach past it by up to a
    block (a partial block at the box's edge is drawn a block wide: 0-180
    in blocks of 10 degrees drew to 187.5); a box across 0 degrees east
    (lon_min > lon_max) runs past 360 on the axis, its labels modulo 360."""
    r = ev.get("region") or {}
    lon = None
    if "lon_min" in r and "lon_max" in r and r["lon_min"] != r["lon_max"]:
        # across 0 degrees east (350 to 10): 350 to 370 on the axis, labelled modulo 360
        lon = (r["lon_min"], r["lon_max"] + (360 if r["lon_min"] > r["lon_max"] else 0))
    lat = (r["lat_min"], r["lat_max"]) if r.get("lat_min", 0) < r.get("lat_max", 0) else None
    return lon, lat


def save(field, ev, path_base):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        np.save(path_base + ".npy", field)
        return path_base + ".npy"
    fig, ax = plt.subplots(figsize=(6, 4))
    im = ax.imshow(field[0], origin="lower", extent=extent(ev), aspect="auto", cmap="viridis")
    xlim, ylim = limits(ev)
    if xlim:
        ax.set_xlim(*xlim)
        if xlim[1] > 360:
            from matplotlib.ticker import FuncFormatter
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: "%g" % (x % 360)))
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("longitude (degrees east)")
    ax.set_ylabel("latitude")
    fig.colorbar(im, ax=ax)
    ax.set_title("step %d, level 1" % ev["step"])
    fig.savefig(path_base + ".png")
    plt.close(fig)
    return path_base + ".png"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nameserver", required=True)
    ap.add_argument("--box", default="0,90,0,180")
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--seconds", type=float, default=60)
    a = ap.parse_args()
    box = [float(x) for x in a.box.split(",")]
    if len(box) != 4:
        ap.error("--box wants lat_min,lat_max,lon_min,lon_max")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    params = dict(zip(("lat_min", "lat_max", "lon_min", "lon_max"), box), stride=a.stride)
    ctx = lecho.Context(nameserver=a.nameserver, quiet=True)
    sub = ctx.channel("atmosphere.field").subscribe(modulator=region_modulator(), params=params)
    print("subscribed", flush=True)
    end = time.monotonic() + a.seconds
    events = 0
    ev = field = None
    try:
        while True:
            try:
                ev = sub.get(timeout=max(0.01, end - time.monotonic()))
            except lecho.LechoError as e:
                if e.code == "timeout":
                    print("no final event within %g s" % a.seconds)
                    break
                raise
            events += 1
            if "field" in ev and (ev["step"] % a.every == 0 or ev.get("final")):
                shape = (ev["nlev"], ev["nlat"], ev["nlon"])
                line = "step %d t %.1f h region %dx%dx%d" % ((ev["step"], ev["t"]) + shape)
                if np is not None:
                    # the region's block means, an <f8 array: a NumPy array over
                    # lecho's memory (no copy), reshaped to the grid it describes
                    field = np.asarray(ev["field"], dtype=float).reshape(shape)
                    line += " min %.3f mean %.3f max %.3f" % (field.min(), field.mean(), field.max())
                    if a.out:
                        line += " saved " + save(field, ev, os.path.join(a.out, "step%05d" % ev["step"]))
                print(line, flush=True)
            if ev.get("final"):
                print("final step %d, %d events, %d bytes received" % (
                    ev.get("step", 0), events, sum(r["bytes_in"] for n, r in ctx.stats()["channels"].items()
                                                    if "atmosphere.field" in n)), flush=True)
                break
    except KeyboardInterrupt:
        print("interrupted")
    finally:
        # a received array is lecho's memory: let go of the last event's
        # before the context closes (doc/python.md, arrays)
        ev = field = None
        sub.close()
        ctx.close(1)


if __name__ == "__main__":
    main()
