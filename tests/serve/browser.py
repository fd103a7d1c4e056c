#!/usr/bin/env python3
"""browser.py: the chat page of `kiln serve` in headless Chromium, driven by
Selenium (Debian: chromium, chromium-driver, python3-selenium): load the
page against a running server with the small test model, check the model
name, render some Markdown, send a message, wait for the streamed answer,
send a long one and press stop mid-stream (its slot must be freed), check
the conversation is in localStorage, and save a screenshot to
$BUILD/tests/serve_page.png. Skipped with a message when Chromium, its
driver or Selenium is missing."""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BUILD, KILN, Server, Tally, find_model  # noqa: E402

T = Tally()
model, extra, why = find_model()
browser = shutil.which("chromium") or shutil.which("chromium-browser")
driver = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None
if not model or not os.path.exists(KILN):
    T.skip("serve_browser", why or KILN + " not built")
    T.done()
if not browser or not driver or not webdriver:
    T.skip("serve_browser", "Chromium, chromedriver or Selenium missing (CI installs chromium chromium-driver "
           "python3-selenium)")
    T.done()

srv = Server(model, ["--parallel", "2", "--ctx", "2048", "-t", "2"] + extra)
opts = webdriver.ChromeOptions()
opts.binary_location = browser
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,760"):
    opts.add_argument(a)
d = None
try:
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(60)
    wait = WebDriverWait(d, 120)
    d.get("http://127.0.0.1:%d/" % srv.port)
    wait.until(lambda d: d.find_element(By.ID, "model").text not in ("", "…"))
    T.check("page_model_name", d.find_element(By.ID, "model").text == os.path.basename(model),
            d.find_element(By.ID, "model").text)
    html = d.execute_script("return markdown('# Title\\n\\nSome **bold** and `code`.\\n\\n- a\\n- b\\n\\n"
                            "```c\\nint x = 1 < 2;\\n```\\n<script>x</script>')")
    T.check("page_markdown", "<h3>Title</h3>" in html and "<strong>bold</strong>" in html and "<code>code</code>" in html
            and "<ul><li>a</li><li>b</li></ul>" in html and '<pre><code data-lang="c">int x = 1 &lt; 2;</code></pre>' in html
            and "<script>" not in html, html)

    def send(text):
        box = d.find_element(By.ID, "input")
        box.clear()
        box.send_keys(text)
        d.find_element(By.ID, "send").click()

    def assistant():
        return d.find_elements(By.CSS_SELECTOR, ".msg.assistant")

    # a short answer, streamed to the end
    d.find_element(By.ID, "toggle-settings").click()
    mx = d.find_element(By.ID, "s-max")
    mx.clear()
    mx.send_keys("24")
    d.find_element(By.ID, "s-temp").clear()
    d.find_element(By.ID, "s-temp").send_keys("0")
    d.find_element(By.ID, "toggle-settings").click()
    send("What is the capital of France?")
    wait.until(lambda d: len(assistant()) == 1 and "done" in assistant()[0].get_attribute("class"))
    a0 = assistant()[0].text
    T.check("page_streamed_answer", a0.strip() and "Error" not in a0, a0)
    T.check("page_tokens_per_second", "tokens/s" in d.find_element(By.ID, "tps").text, d.find_element(By.ID, "tps").text)

    # a long answer, stopped mid-stream
    d.find_element(By.ID, "toggle-settings").click()
    mx.clear()
    mx.send_keys("1500")
    d.find_element(By.ID, "s-temp").clear()
    d.find_element(By.ID, "s-temp").send_keys("1")
    d.find_element(By.ID, "toggle-settings").click()
    send("Write a very long story about a lighthouse keeper.")
    wait.until(lambda d: len(assistant()) == 2 and len(assistant()[1].text) > 20)
    d.find_element(By.ID, "stop").click()
    wait.until(lambda d: "done" in assistant()[1].get_attribute("class"))
    stopped = assistant()[1].text
    freed = False
    for _ in range(50):
        m = srv.metrics()
        if m.get("kiln_slots_used") == 0:
            freed = True
            break
        time.sleep(0.1)
    T.check("page_stop", freed and not d.find_element(By.ID, "send").get_attribute("disabled") and "Error" not in stopped,
            "slot freed %s, text %r" % (freed, stopped[:100]))
    convs = json.loads(d.execute_script("return localStorage.getItem('kiln.convs')") or "[]")
    T.check("page_local_storage", convs and len(convs[0]["messages"]) == 4 and
            convs[0]["messages"][0]["content"] == "What is the capital of France?", convs)
    shot = os.path.join(BUILD, "tests", "serve_page.png")
    d.save_screenshot(shot)
    T.check("page_screenshot", os.path.getsize(shot) > 1000, shot)
except Exception as e:  # noqa: BLE001
    T.bad("serve_browser", repr(e)[:500])
finally:
    if d:
        d.quit()
    srv.stop()
T.done()
