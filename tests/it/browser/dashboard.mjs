// Drives `mailslot dashboard` in Debian's Chromium (headless) for tests/it/dashboard.rs.
//
// Environment: MAILSLOT_PLAYWRIGHT (playwright-core's entry file), MAILSLOT_CHROMIUM, and from
// the test: DASHBOARD_URL (the launch page, file://), AGENT (bob), REQUESTER (alice), CODE (alice's
// request code), PASSPHRASE (bob's owner passphrase), HOSTILE_SUBJECT, HOSTILE_BODY, TOTAL (how
// many messages bob has at the start), SEARCH_WORD and SEARCH_SUBJECT (the one message with
// that word), and optionally SCREENSHOT (a PNG path for the README).
//
// Talks to the test on stdin/stdout, one line each way: it prints `alone` once the owner's
// changes, the paging, the search and the marks are checked, with the dashboard the only
// process holding bob's connection; the test checks presence, starts bob's `mailslot mcp` and
// answers `session`. It prints `ready` once the inbox page is live; the test has alice send
// the hostile message and answers `sent`; then the owner writes to bob from his inbox page. It
// prints `done` at the end. Any failed check
// throws, and the process exits non-zero with the reason.
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
const total = Number(env("TOTAL"));
const PAGE = 50;
// The server's one date format, for live rows too.
const DATE = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/;
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
  // a clean URL with the agent listed, its connection held (hidden from presence).
  await page.goto(url);
  await page.waitForURL((u) => u.protocol === "http:" && u.pathname === "/");
  origin = new URL(page.url()).origin;
  check(page.url() === `${origin}/`, `on a clean URL, not ${page.url()}`);
  await page.locator(`td a[href="/agents/${agent}"]`).waitFor();
  const icon = await page.request.get(`${origin}/favicon.ico`);
  check(icon.status() === 200 && icon.headers()["content-type"] === "image/x-icon", `the favicon: ${icon.status()}`);

  // Approve alice's request: one passphrase field for the page, a button per change. A wrong
  // passphrase first: said once, the typed code kept, the passphrase not.
  const contacts = `${origin}/agents/${agent}/contacts`;
  await page.goto(contacts);
  const request = page.locator(`section.request[data-from="${requester}"]`);
  await request.waitFor();
  check((await page.locator('input[name="passphrase"]').count()) === 1, "one passphrase field on the page");
  const code = request.locator(`input[name="code.${requester}"]`);
  const approve = request.locator('button[data-action="approve"]');
  const passphrase = page.locator('input[name="passphrase"]');
  await code.fill(env("CODE"));
  await passphrase.fill("not the owner's passphrase");
  await Promise.all([page.waitForURL(/flash=/), approve.click()]);
  const notice = page.locator("#notice");
  await notice.waitFor();
  check((await notice.getAttribute("class")).includes("danger"), `the wrong passphrase failed: ${await notice.textContent()}`);
  check((await code.inputValue()) === env("CODE"), `the code is kept: ${await code.inputValue()}`);
  check((await passphrase.inputValue()) === "", "the passphrase is not echoed back into the page");
  await passphrase.fill(env("PASSPHRASE"));
  await Promise.all([page.waitForURL(/flash=/), approve.click()]);
  await notice.waitFor();
  const said = await notice.textContent();
  check(
    (await notice.getAttribute("class")).includes("ok") && said.includes(requester),
    `the approval succeeded: ${said}`,
  );
  check((await request.count()) === 0, "the request is no longer open");
  check((await passphrase.inputValue()) === "", "the passphrase is not echoed back into the page");
  // Post/Redirect/Get: a reload reads the page again, posts nothing, and says nothing twice.
  await page.reload();
  await page.locator("form#consent").waitFor();
  check((await page.locator("#notice").count()) === 0, "the notice shows once");

  // The policy, signed like the other changes.
  await page.locator('select[name="policy"]').selectOption("open");
  await passphrase.fill(env("PASSPHRASE"));
  await Promise.all([page.waitForURL(/flash=/), page.locator('button[data-action="policy"]').click()]);
  await notice.waitFor();
  check((await notice.getAttribute("class")).includes("ok"), `the policy changed: ${await notice.textContent()}`);
  check((await page.locator("#policy").textContent()) === "open", "the policy shown is open");

  // The inbox: the counts, the marks in words, then every page, newest first, each message
  // once although all were sent at the same millisecond.
  await page.goto(`${origin}/agents/${agent}`);
  check((await page.locator(`[data-total="${agent}"]`).textContent()) === String(total), "the total count");
  check((await page.locator(`[data-unread="${agent}"]`).textContent()) === String(total), "the unread count");
  const rows = page.locator("ul#inbox li");
  check((await rows.count()) === PAGE, `a page of ${PAGE}`);
  check((await rows.nth(0).locator(".flag.urgent").textContent()) === "urgent", "the newest is marked urgent, in words");
  check(
    (await rows.nth(1).locator(".flag.ack").textContent()) === "acknowledgement requested",
    "the next asks to be acknowledged, in words",
  );
  check(DATE.test(await rows.nth(0).locator(".muted").textContent()), "the server's date format");
  const seen = [];
  let pages = 0;
  for (;;) {
    pages += 1;
    seen.push(...(await rows.evaluateAll((els) => els.map((e) => e.dataset.id))));
    const older = page.locator('nav.pages a[rel="next"]');
    if ((await older.count()) === 0) break;
    await Promise.all([page.waitForNavigation(), older.click()]);
  }
  check(pages === Math.ceil(total / PAGE), `${pages} pages`);
  check(seen.length === total && new Set(seen).size === total, `every message once: ${seen.length} rows, ${new Set(seen).size} distinct`);

  // Search the agent's mail from the inbox's search box.
  await page.goto(`${origin}/agents/${agent}`);
  await page.locator('form.search input[name="q"]').fill(env("SEARCH_WORD"));
  await Promise.all([page.waitForNavigation(), page.locator('form.search button[type="submit"]').click()]);
  const found = page.locator("ul#found li a");
  check((await found.count()) === 1, `one message found, not ${await found.count()}`);
  check((await found.first().textContent()) === env("SEARCH_SUBJECT"), "the message with the word");

  // Alone with bob's connection: the test checks that alice does not see bob online, then
  // starts a session of bob's, to which the dashboard gives the connection up.
  const agentRow = async (wanted) => {
    const deadline = Date.now() + TIMEOUT;
    for (;;) {
      await page.goto(`${origin}/`);
      const row = await page.locator(`tr:has(a[href="/agents/${agent}"])`).textContent();
      if (row.includes(wanted)) return;
      check(Date.now() < deadline, `the agents page never said "${wanted}": ${row}`);
    }
  };
  await agentRow("connected to the relay");
  console.log("alone");
  await expectLine("session");
  await agentRow("another mailslot process");

  // The inbox, live: a marker that a reload would lose.
  await page.goto(`${origin}/agents/${agent}`);
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await page.locator('body[data-live="connected"]').waitFor({ state: "attached" });
  console.log("ready");
  await expectLine("sent");

  // alice's message arrives without a reload (stored by bob's session, another process),
  // its subject as text, its marks in words, its date as the server writes dates.
  const fresh = page.locator("ul#inbox li.fresh");
  await fresh.waitFor();
  check(await page.evaluate(() => window.__sameDocument === true), "the page was not reloaded");
  const link = fresh.locator("a");
  check((await link.textContent()) === hostileSubject, `the subject is shown as text: ${await link.textContent()}`);
  check((await fresh.locator("img").count()) === 0, "no element made from the subject");
  check((await fresh.locator(".flag.urgent").textContent()) === "urgent", "the live row says urgent");
  check((await fresh.locator(".flag.ack").textContent()) === "acknowledgement requested", "the live row asks for an ack");
  const date = await fresh.locator(".muted").textContent();
  check(DATE.test(date), `the live row's date is in the server's format: ${date}`);
  check((await page.locator(`[data-total="${agent}"]`).textContent()) === String(total + 1), "the total count went up");

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

  // The owner writes to the agent from its inbox page: signed with the owner key, listed as
  // the owner's, the passphrase not echoed back (Post/Redirect/Get).
  await page.goto(`${origin}/agents/${agent}`);
  await page.locator("details#tell summary").click();
  const tell = page.locator("form.tell");
  await tell.locator('input[name="subject"]').fill("From the page");
  await tell.locator('textarea[name="body"]').fill("OWNER-PAGE-1 pause the release.");
  await tell.locator('input[name="passphrase"]').fill(env("PASSPHRASE"));
  await Promise.all([page.waitForURL(/flash=/), tell.locator('button[type="submit"]').click()]);
  const told = page.locator("#notice");
  await told.waitFor();
  check((await told.getAttribute("class")).includes("ok"), `told: ${await told.textContent()}`);
  const mine = page.locator("ul#inbox li", { hasText: "From the page" });
  check((await mine.locator(".from").textContent()) === "from you, the owner", "listed as the owner's");
  check((await page.locator('form.tell input[name="passphrase"]').inputValue()) === "", "the passphrase is not echoed back");
  await Promise.all([page.waitForNavigation(), mine.locator("a").click()]);
  check((await page.locator("p.fence").textContent()).includes("Written by you, the owner"), "the message page says whose words they are");

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
