"""Drives hamburger-server's chat page in headless Chromium (Debian's chromium
and chromedriver, through selenium): types each turn, waits for the streamed
answer, and asks the API for the same request (the same messages, greedy,
not streamed). Prints one JSON object: per turn the page's text, the API's,
the shaded steps and what the page's live counters ended at.

    python webui_chat.py --url http://127.0.0.1:8080 --confidence 0.9 \
        --turn "Hello!" --turn "Tell me more." [--system TEXT] [--screenshot out.png]

Nothing is downloaded: selenium is told where the driver is and to stay offline.
"""
import argparse
import json
import os
import sys
import urllib.request

os.environ["SE_OFFLINE"] = "true"
os.environ["SE_AVOID_STATS"] = "true"

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser(width, height):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--force-device-scale-factor=1", "--no-first-run"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


def set_input(driver, element_id, value):
    """Sets an input's value as a person would, firing its input event."""
    driver.execute_script(
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input', {bubbles: true}));", element_id, str(value))


def api_answer(url, messages, args):
    body = {"messages": messages, "temperature": 0, "confidence": args.confidence, "max_tokens": args.max_tokens,
            "logprobs": True, "top_logprobs": 2}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return answer["choices"][0], answer["usage"]["completion_tokens"], answer["timings"]["macro_steps"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--turn", action="append", required=True)
    p.add_argument("--system", default="")
    p.add_argument("--confidence", type=float, required=True)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--screenshot")
    args = p.parse_args()

    driver = browser(1280, 860)
    try:
        driver.get(args.url + "/")
        # The sliders start at the server's defaults (/props), not at the page's own.
        with urllib.request.urlopen(args.url + "/props", timeout=60) as r:
            defaults = json.load(r)["default_generation_settings"]["params"]
        for element_id in ["confidence", "temperature"]:
            WebDriverWait(driver, 60).until(lambda d, i=element_id: float(
                d.find_element(By.ID, i).get_attribute("value")) == defaults[i])
        set_input(driver, "system", args.system)
        set_input(driver, "temperature", 0)
        set_input(driver, "confidence", args.confidence)
        set_input(driver, "max-tokens", args.max_tokens)
        messages = [{"role": "system", "content": args.system}] if args.system else []
        turns = []
        for n, text in enumerate(args.turn, 1):
            driver.find_element(By.ID, "prompt").send_keys(text)
            driver.find_element(By.ID, "send").click()
            WebDriverWait(driver, 600).until(lambda d: len(d.find_elements(
                By.CSS_SELECTOR, ".msg.assistant:not([data-state=streaming])")) == n)
            page = driver.execute_script("""
                const li = [...document.querySelectorAll('.msg.assistant')].pop();
                const steps = [...li.querySelectorAll('.content .step')];
                return {
                    text: li.querySelector('.content').textContent,
                    state: li.dataset.state,
                    steps: steps.length,
                    shades: [...new Set(steps.map((s) => ['s0', 's1'].find((c) => s.classList.contains(c))))].sort(),
                    multi: steps.filter((s) => s.classList.contains('multi')).length,
                    step_tokens: steps.map((s) => Number(s.dataset.tokens)),
                    step_steps: steps.map((s) => Number(s.dataset.steps)),
                    stat_tokens: Number(document.getElementById('stat-tokens').textContent),
                    error: document.getElementById('error').textContent,
                };""")
            messages.append({"role": "user", "content": text})
            api_choice, api_tokens, api_steps = api_answer(args.url, messages, args)
            messages.append({"role": "assistant", "content": page["text"]})
            turns.append({"page": page, "api": api_choice, "api_tokens": api_tokens, "api_steps": api_steps})
        if args.screenshot:
            driver.save_screenshot(args.screenshot)
        json.dump({"turns": turns}, sys.stdout)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
