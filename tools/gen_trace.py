#!/usr/bin/env python3
"""Generate a multi-turn voice-command trace (JSON lines, docs/trace-format.md).

N streams x T turns. Every request of a stream carries the same system prompt (~300 tokens: the
devices and the answer format); turn t's prompt is the system prompt plus the earlier turns (the
replayer builds it). Commands are drawn from a Zipf(1) distribution over 40 commands, so the ten
most frequent cover about two thirds of the requests. Seeded: the same arguments give the same file.

    python tools/gen_trace.py --variant home --streams 5 --turns 12 -o tools/traces/voice-home-5x12.jsonl
    python tools/gen_trace.py --variant car  --streams 5 --turns 12 -o tools/traces/voice-car-5x12.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

MAX_REQUESTS = 1_000_000  # a trace larger than this is a typo, not a benchmark

HOME_SYSTEM = (
    "You are the voice assistant of a smart home. You control these devices: "
    "light.kitchen, light.living_room, light.bedroom, light.hallway, light.bathroom and "
    "light.garden (on, off, dim 0-100 percent, color); thermostat.main (heat, cool, off, set "
    "16-28 degrees Celsius); blinds.living_room and blinds.bedroom (open, close, set 0-100 "
    "percent); lock.front_door and lock.garage (lock, unlock, status); speaker.kitchen and "
    "speaker.living_room (play, pause, next, volume 0-10); tv.living_room (on, off, channel, "
    "volume); vacuum.robot (start, stop, dock); oven.kitchen (preheat, off, timer); "
    "camera.front (snapshot); sensor.humidity and sensor.temperature (read). "
    "Rules: answer every command with exactly one line of the form DEVICE ACTION VALUE | "
    "confirmation, naming one device and one action from the list (leave VALUE out when the "
    "action takes none), with a confirmation of at most eight words that can be spoken "
    "aloud. If the command names no known device, answer none clarify | and ask one short "
    "question. Never unlock a door unless the user says the word unlock. Use the earlier "
    "turns of the conversation to resolve words like it, there, again or warmer. Never "
    "invent devices."
)

CAR_SYSTEM = (
    "You are the in-car voice assistant of an electric vehicle. You can operate: climate "
    "(driver and passenger temperature 16-28 C, fan 0-7, defrost front and rear, seat heating "
    "0-3 per seat, steering wheel heating), windows (each window open, close, vent), sunroof "
    "(open, close, tilt), media (radio station, playlist, podcast, pause, resume, next, volume "
    "0-30), phone (call a contact, answer, hang up, read last message), navigation (go to an "
    "address or a saved place such as home, work, gym, nearest charger, cancel route, show "
    "range), lights (cabin, ambient color), drive modes (eco, comfort, sport) and the charge "
    "port (open, close). Answer format: one line that begins with a compact command of the form "
    "CMD(system, action, argument) using the names above, followed by a spoken reply of at most "
    "eight words. Safety rules: never open the charge port or change drive mode while the car "
    "is moving faster than 5 km/h unless the user insists; never read messages aloud while "
    "navigation is giving directions; if a request is ambiguous ask exactly one short question "
    "with CMD(none, clarify, none). Use earlier turns to resolve it, that, again, warmer, louder. "
    "Keep replies short, friendly and free of explanations, and never invent contacts or places "
    "that were not mentioned before."
)

HOME_COMMANDS = [
    ("turn on the kitchen light", 'light.kitchen on | Kitchen light is on.'),
    ("turn off the living room light", 'light.living_room off | Living room light off.'),
    ("what's the temperature inside", 'sensor.temperature read | It is 21 degrees.'),
    ("set the thermostat to 22", 'thermostat.main set 22 | Heating to 22 degrees.'),
    ("lock the front door", 'lock.front_door lock | Front door locked.'),
    ("play some music in the kitchen", 'speaker.kitchen play | Playing music in the kitchen.'),
    ("close the bedroom blinds", 'blinds.bedroom close | Bedroom blinds closing.'),
    ("dim the bedroom light to 30 percent", 'light.bedroom dim 30 | Bedroom light at 30 percent.'),
    ("turn it off", 'light.kitchen off | Turned it off.'),
    ("start the vacuum", 'vacuum.robot start | Vacuum started.'),
    ("make it warmer", 'thermostat.main set 23 | One degree warmer.'),
    ("turn up the volume", 'speaker.kitchen volume 7 | Volume up.'),
    ("is the garage locked", 'lock.garage status | The garage is locked.'),
    ("open the living room blinds halfway", 'blinds.living_room set 50 | Blinds at half.'),
    ("preheat the oven to 200 degrees", 'oven.kitchen preheat 200 | Oven preheating to 200.'),
    ("turn on the tv", 'tv.living_room on | TV is on.'),
    ("next song", 'speaker.kitchen next | Next song.'),
    ("turn on the garden lights", 'light.garden on | Garden lights on.'),
    ("how humid is it", 'sensor.humidity read | Humidity is 45 percent.'),
    ("pause the music", 'speaker.kitchen pause | Music paused.'),
    ("switch off the hallway light", 'light.hallway off | Hallway light off.'),
    ("send the vacuum back to its dock", 'vacuum.robot dock | Vacuum is docking.'),
    ("show me the front camera", 'camera.front snapshot | Here is the front camera.'),
    ("make the living room light blue", 'light.living_room color blue | Living room light is blue.'),
    ("turn the heating off", 'thermostat.main off | Heating off.'),
    ("set a timer on the oven for 20 minutes", 'oven.kitchen timer 20 | Oven timer set.'),
    ("turn on the bathroom light", 'light.bathroom on | Bathroom light on.'),
    ("change the channel to the news", 'tv.living_room channel news | Switching to the news.'),
    ("lock the garage", 'lock.garage lock | Garage locked.'),
    ("again", 'speaker.kitchen next | Skipping again.'),
    ("cool the house down to 20", 'thermostat.main cool 20 | Cooling to 20 degrees.'),
    ("open the bedroom blinds", 'blinds.bedroom open | Bedroom blinds opening.'),
    ("turn the tv volume down", 'tv.living_room volume 10 | TV volume down.'),
    ("is the front door locked", 'lock.front_door status | Yes, it is locked.'),
    ("play music in the living room", 'speaker.living_room play | Playing in the living room.'),
    ("switch the oven off", 'oven.kitchen off | Oven is off.'),
    ("turn off all the lights in the garden", 'light.garden off | Garden lights off.'),
    ("stop the vacuum", 'vacuum.robot stop | Vacuum stopped.'),
    ("brighten the kitchen light", 'light.kitchen dim 100 | Kitchen light at full.'),
    ("open the garage door", 'none clarify | Should I unlock the garage?'),
]

CAR_COMMANDS = [
    ("set the temperature to 21", "CMD(climate, driver_temperature, 21) Set to 21 degrees."),
    ("navigate home", "CMD(navigation, go_to, home) Starting route home."),
    ("play my driving playlist", "CMD(media, playlist, driving) Playing your driving playlist."),
    ("call mom", "CMD(phone, call, mom) Calling mom."),
    ("turn on the seat heating", "CMD(climate, seat_heating_driver, 2) Seat heating on."),
    ("louder", "CMD(media, volume, 18) Volume up."),
    ("find the nearest charger", "CMD(navigation, go_to, nearest_charger) Routing to the nearest charger."),
    ("open the sunroof", "CMD(sunroof, open, none) Opening the sunroof."),
    ("defrost the windshield", "CMD(climate, defrost_front, on) Front defrost on."),
    ("how much range do I have", "CMD(navigation, show_range, none) About 240 kilometers left."),
    ("next song", "CMD(media, next, none) Next song."),
    ("close all the windows", "CMD(windows, close, all) Closing all windows."),
    ("switch to eco mode", "CMD(drive_mode, set, eco) Eco mode on."),
    ("read my last message", "CMD(phone, read_last_message, none) Message from Sam: running late."),
    ("make it warmer", "CMD(climate, driver_temperature, 22) One degree warmer."),
    ("pause the podcast", "CMD(media, pause, none) Podcast paused."),
    ("navigate to work", "CMD(navigation, go_to, work) Starting route to work."),
    ("turn the fan down", "CMD(climate, fan, 2) Fan down."),
    ("open the charge port", "CMD(charge_port, open, none) Charge port open."),
    ("set the ambient light to blue", "CMD(lights, ambient_color, blue) Ambient light is blue."),
    ("hang up", "CMD(phone, hang_up, none) Call ended."),
    ("vent the rear windows", "CMD(windows, vent, rear) Rear windows vented."),
    ("cancel the route", "CMD(navigation, cancel_route, none) Route cancelled."),
    ("turn on the steering wheel heating", "CMD(climate, steering_wheel_heating, on) Steering wheel heating on."),
    ("play the radio", "CMD(media, radio, last_station) Playing the radio."),
    ("resume", "CMD(media, resume, none) Resuming."),
    ("sport mode", "CMD(drive_mode, set, sport) Sport mode on."),
    ("close the sunroof", "CMD(sunroof, close, none) Closing the sunroof."),
    ("turn on the cabin light", "CMD(lights, cabin, on) Cabin light on."),
    ("answer the call", "CMD(phone, answer, none) Answering."),
    ("set the passenger side to 23", "CMD(climate, passenger_temperature, 23) Passenger side at 23."),
    ("take me to the gym", "CMD(navigation, go_to, gym) Starting route to the gym."),
    ("again", "CMD(media, next, none) Skipping again."),
    ("turn off the rear defrost", "CMD(climate, defrost_rear, off) Rear defrost off."),
    ("play a podcast", "CMD(media, podcast, latest) Playing the latest podcast."),
    ("open my window a bit", "CMD(windows, vent, driver) Driver window vented."),
    ("comfort mode please", "CMD(drive_mode, set, comfort) Comfort mode on."),
    ("turn the volume down", "CMD(media, volume, 8) Volume down."),
    ("close the charge port", "CMD(charge_port, close, none) Charge port closed."),
    ("call the office", "CMD(none, clarify, none) Which office contact?"),
]

VARIANTS = {"home": (HOME_SYSTEM, HOME_COMMANDS), "car": (CAR_SYSTEM, CAR_COMMANDS)}


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (rank + 1) ** s for rank in range(n)]


def generate(variant: str, streams: int, turns: int, seed: int, max_tokens: int,
             think_s: float) -> list[dict]:
    system, commands = VARIANTS[variant]
    rng = random.Random(seed)
    weights = zipf_weights(len(commands))
    rows = []
    for s in range(streams):
        t_arrival = round(s * 0.7, 3)  # streams start staggered
        for turn in range(1, turns + 1):
            command, answer = rng.choices(commands, weights)[0]
            rows.append({"stream": f"s{s}", "turn": turn, "system": system, "command": command,
                         "max_tokens": max_tokens, "arrival_s": t_arrival, "answer": answer})
            t_arrival = round(t_arrival + think_s * (0.5 + rng.random()), 3)
    rows.sort(key=lambda r: (r["arrival_s"], r["stream"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="home")
    ap.add_argument("--streams", type=int, default=5)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--think-s", type=float, default=6.0, help="mean pause between turns")
    ap.add_argument("-o", "--output", help="output file (default: stdout)")
    args = ap.parse_args(argv)
    if args.streams < 1 or args.turns < 1:
        ap.error("--streams and --turns must be at least 1")
    if args.streams * args.turns > MAX_REQUESTS:
        ap.error(f"--streams x --turns is {args.streams * args.turns:,} requests; at most "
                 f"{MAX_REQUESTS:,} per trace")
    if args.max_tokens < 1:
        ap.error(f"--max-tokens must be at least 1 (the readers refuse 0), got {args.max_tokens}")
    if not math.isfinite(args.think_s) or args.think_s < 0:
        ap.error(f"--think-s must be a number of seconds >= 0, got {args.think_s}")
    if args.output:
        out = Path(args.output)
        if out.is_dir() or not out.parent.is_dir():
            ap.error(f"-o {out}: give a file name in an existing folder")
    rows = generate(args.variant, args.streams, args.turns, args.seed, args.max_tokens, args.think_s)
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            ap.error(f"-o {args.output}: cannot write ({exc.strerror})")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
