// Drives `mailslot dashboard` in Debian's Chromium (headless) for tests/it/dashboard.rs.
//
// Environment: MAILSLOT_PLAYWRIGHT (playwright-core's entry file), MAILSLOT_CHROMIUM, and from
// the test: DASHBOARD_URL (the launch page, file://), AGENT (bob), REQUESTER (alice), CODE (alice's
// request code), PASSPHRASE (bob's owner passphrase), HOSTILE_SUBJECT, HOSTILE_BODY, and
// optionally SCREENSHOT (a PNG path for the README).
//
// Talks to the test on stdin/stdout, one line each way: it prints `ready` once the inbox page
// is live; the test then has alice send the hostile message and answers `sent`. It prints
// `done` at the end. Any failed check throws, and the process exits non-zero with the reason.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.MAILSLOT_PLAYWRIGHT);

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const url = env("DASHBOARD_URL");
const agent = env("AGENT");
const requester = env("REQUESTER");
const hostileSubject = env("HOSTILE_SUBJECT");
const hostileBody = env("HOSTILE_BODY");
let origin;
const TIMEOUT = 20_000;

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
}

const stdin = createInterface({ input: process.stdin });
const stdinLines = stdin[Symbol.asyncIterator]();
async function expectLine(expected) {
  const { value, done } = await stdinLines.next();
  check(!done && value.trim() === expected, `the test said ${JSON.stringify(value)}, expected ${expected}`);
}

const browser = await chromium.launch({
  executablePath: env("MAILSLOT_CHROMIUM"),
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--no-first-run",
    "--metrics-recording-only",
  ],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 720 } });
  page.setDefaultTimeout(TIMEOUT);
  const dialogs = [];
  page.on("dialog", (d) => {
    dialogs.push(d.message());
    d.dismiss();
  });

  // Open the launch page (a file:// URL): it posts the secret, and the dashboard comes up on
  // a clean URL with the agent listed.
  await page.goto(url);
  await page.waitForURL((u) => u.protocol === "http:" && u.pathname === "/");
  origin = new URL(page.url()).origin;
  check(page.url() === `${origin}/`, `on a clean URL, not ${page.url()}`);
  await page.locator(`td a[href="/agents/${agent}"]`).waitFor();

  // Approve alice's request with the code and the owner's passphrase, typed into the page.
  await page.goto(`${origin}/agents/${agent}/contacts`);
  const request = page.locator(`section.request[data-from="${requester}"]`);
  await request.waitFor();
  const approve = request.locator('form[data-action="approve"]');
  await approve.locator('input[name="code"]').fill(env("CODE"));
  await approve.locator('input[name="passphrase"]').fill(env("PASSPHRASE"));
  await Promise.all([page.waitForNavigation(), approve.locator('button[type="submit"]').click()]);
  const notice = page.locator("#notice");
  await notice.waitFor();
  const said = await notice.textContent();
  check(
    (await notice.getAttribute("class")).includes("ok") && said.includes(requester),
    `the approval succeeded: ${said}`,
  );
  check(
    (await page.locator(`section.request[data-from="${requester}"]`).count()) === 0,
    "the request is no longer open",
  );
  check(
    (await page.locator('input[name="passphrase"]').evaluateAll((els) => els.every((e) => e.value === ""))),
    "the passphrase is not echoed back into the page",
  );

  // The inbox, live: a marker that a reload would lose.
  await page.goto(`${origin}/agents/${agent}`);
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await page.locator('body[data-live="connected"]').waitFor({ state: "attached" });
  console.log("ready");
  await expectLine("sent");

  // alice's message arrives without a reload, its subject as text.
  const row = page.locator("ul#inbox li.fresh");
  await row.waitFor();
  check(await page.evaluate(() => window.__sameDocument === true), "the page was not reloaded");
  const link = row.locator("a");
  check((await link.textContent()) === hostileSubject, `the subject is shown as text: ${await link.textContent()}`);
  check((await row.locator("img").count()) === 0, "no element made from the subject");

  // Read it: the body is the literal text, nothing in it ran or became an element.
  await Promise.all([page.waitForNavigation(), link.click()]);
  const body = page.locator("section.untrusted pre.body");
  await body.waitFor();
  check((await body.textContent()) === hostileBody, `the body is shown as text: ${await body.textContent()}`);
  check(await body.isVisible(), "the body is visible");
  check((await page.locator("section.untrusted img, section.untrusted script").count()) === 0, "no img or script element in the message");
  check((await page.locator("section.untrusted h2.subject").textContent()) === hostileSubject, "the subject heading is text");
  check((await page.locator("p.fence").textContent()).includes(`Written by ${requester}`), "the sender's words are framed as theirs");
  check(await page.evaluate(() => window.__pwned === undefined), "no script of the sender's ran");
  check(dialogs.length === 0, `no dialog opened: ${dialogs.join(", ")}`);

  if (process.env.SCREENSHOT) await page.screenshot({ path: process.env.SCREENSHOT });
  console.log("done");
} catch (e) {
  // What the page showed, for the test's failure message.
  for (const page of browser.contexts().flatMap((c) => c.pages())) {
    const text = await page.locator("body").innerText().catch(() => "(unreadable)");
    console.error(`page ${page.url()}:\n${text}\n`);
  }
  throw e;
} finally {
  // An open stdin would keep the process alive.
  stdin.close();
  await browser.close();
}
