// preln: what the theme does not do for every page (book/_static/preln.css has the styles).
(function () {
  "use strict";

  // 1. A box that scrolls sideways (a wide table, output, code block or formula; at 320 CSS px
  //    there are many) must be reachable and scrollable by keyboard, and say what it is (WCAG
  //    2.1.1, 1.4.10; axe scrollable-region-focusable). pydata-sphinx-theme 0.17.1 gives
  //    tabindex=0 only to `pre`, `.cell_output > .output` and its own table wrappers, with no
  //    name; a chapter's HTML table scrolls in its own <div style="overflow-x:auto">
  //    (pydata/pydata-sphinx-theme#1100 is the theme's issue for code blocks). Here every box in
  //    the article whose content is wider than itself becomes a named group in the Tab order
  //    ("Output of cell 12", "Code of cell 12": a group, not a region, so that a chapter does not
  //    get dozens of landmarks), and stops being one when the window is wide enough.
  var MARK = "data-preln-scroll";

  function cellNumber(el) {
    var cell = el.closest(".cell");
    if (!cell) return 0;
    var cells = document.querySelectorAll(".bd-article div.cell");
    return Array.prototype.indexOf.call(cells, cell) + 1;
  }

  function describe(el) {
    var caption = el.querySelector("caption"), n = cellNumber(el);
    var table = caption && caption.textContent.trim() ? "Table: " + caption.textContent.trim().slice(0, 80) : "";
    // Outputs first: myst-nb wraps a stream output in div.highlight-myst-ansi, which is not code.
    if (el.closest(".cell_output")) {
      var what = (el.querySelector("table") && !table ? "Table output" : "Output") + (n ? " of cell " + n : "");
      return table ? what + ", " + table : what;
    }
    if (table) return table;
    if (el.matches("mjx-container") || el.querySelector("mjx-container")) return "Formula";
    if (el.closest(".cell_input")) return "Code" + (n ? " of cell " + n : "");
    if (el.closest("div[class*='highlight-']")) return "Code";
    if (el.querySelector("table")) return "Table";
    return "Wide content";
  }

  function markScrollables() {
    var article = document.querySelector(".bd-article") || document.querySelector("main");
    if (!article) return;
    var boxes = article.querySelectorAll("div, pre, mjx-container[display='true'], table");
    for (var i = 0; i < boxes.length; i++) {
      var el = boxes[i], style = getComputedStyle(el);
      var scrolls = (style.overflowX === "auto" || style.overflowX === "scroll") &&
                    el.scrollWidth > el.clientWidth + 1;
      if (scrolls && !el.hasAttribute(MARK)) {
        el.setAttribute(MARK, "");
        el.tabIndex = 0;
        if (!el.hasAttribute("role")) el.setAttribute("role", "group");  // a group, not a landmark
        if (!el.hasAttribute("aria-label")) { el.setAttribute("aria-label", describe(el)); el.setAttribute("data-preln-named", ""); }
      } else if (!scrolls && el.hasAttribute(MARK)) {
        el.removeAttribute(MARK);
        el.removeAttribute("tabindex");
        if (el.getAttribute("role") === "group") el.removeAttribute("role");
        if (el.hasAttribute("data-preln-named")) { el.removeAttribute("aria-label"); el.removeAttribute("data-preln-named"); }
      }
    }
  }

  // Icon-font glyphs are decoration: their private-use characters must not enter names (the
  // theme's CSS-drawn icons get an empty alternative text in preln.css).
  function hideIcons() {
    var icons = document.querySelectorAll("i[class*='fa-']:not([aria-hidden]), span[class*='fa-']:not([aria-hidden])");
    for (var i = 0; i < icons.length; i++) icons[i].setAttribute("aria-hidden", "true");
  }
  document.addEventListener("DOMContentLoaded", hideIcons);

  // 2. Names and states the toolchain leaves out (WCAG 4.1.2, 2.5.3).
  function byId(id) { return document.getElementById(id); }

  // sphinx-togglebutton 0.3 names its button aria-label="Toggle hidden content" while the title
  // shows "Solution ... Click to show" (the hint is the button's CSS ::before): the name is the
  // title's visible text instead, hint included, and follows it when the hint changes.
  function nameToggleButtons() {
    var buttons = document.querySelectorAll("button.toggle-button");
    for (var i = 0; i < buttons.length; i++) {
      var b = buttons[i], title = b.closest(".admonition-title");
      if (!title) continue;
      if (!title.id) title.id = (b.id || "preln-toggle-" + i) + "-title";
      b.removeAttribute("aria-label");
      b.setAttribute("aria-labelledby", title.id);
      var target = b.getAttribute("data-target");
      if (target && byId(target)) b.setAttribute("aria-controls", target);
    }
  }

  // The theme's colour-mode button cycles light, dark and the system's setting, and says none of
  // them: its name carries the current one ("Color mode: Dark").
  function nameThemeSwitch() {
    var mode = document.documentElement.dataset.mode || "auto";
    var label = {light: "Light", dark: "Dark", auto: "System settings"}[mode] || mode;
    var buttons = document.querySelectorAll(".theme-switch-button");
    for (var i = 0; i < buttons.length; i++) buttons[i].setAttribute("aria-label", "Color mode: " + label);
  }

  // The sidebar toggles open and close the navigation without saying so: aria-expanded follows
  // the sidebar (wide screens: sphinx-book-theme's pst-sidebar-hidden class; narrow screens: the
  // theme's modal <dialog>).
  function wide() { return window.matchMedia("(min-width: 992px)").matches; }
  function syncToggles() {
    var pairs = [[".primary-toggle", "pst-primary-sidebar", "pst-primary-sidebar-modal"],
                 [".secondary-toggle", "pst-secondary-sidebar", "pst-secondary-sidebar-modal"]];
    for (var p = 0; p < pairs.length; p++) {
      var sidebar = byId(pairs[p][1]), modal = byId(pairs[p][2]);
      var buttons = document.querySelectorAll("button" + pairs[p][0]);
      for (var i = 0; i < buttons.length; i++) {
        var b = buttons[i], inline = wide() && sidebar && p === 0;
        var open = inline ? !sidebar.classList.contains("pst-sidebar-hidden") : !!(modal && modal.open);
        b.setAttribute("aria-expanded", open ? "true" : "false");
        var controls = inline ? sidebar : modal;
        if (controls && controls.id) b.setAttribute("aria-controls", controls.id);
      }
    }
  }

  // Both themes wire up only the first button of each kind (document.querySelector
  // ".primary-toggle": pydata-sphinx-theme's, hidden on a wide screen), so the article header's own
  // "Toggle primary sidebar" did nothing when pressed: it passes its clicks on to that one.
  function forwardToggles() {
    [".primary-toggle", ".secondary-toggle"].forEach(function (sel) {
      var buttons = document.querySelectorAll("button" + sel);
      for (var i = 1; i < buttons.length; i++) {
        buttons[i].addEventListener("click", function (e) {
          e.preventDefault();
          document.querySelector(sel).click();
        });
      }
    });
  }

  // Dialogs named: the theme's search dialog and the sidebars' modals have no name.
  function nameDialogs() {
    var names = {"pst-search-dialog": "Search this book", "pst-primary-sidebar-modal": "Site navigation",
                 "pst-secondary-sidebar-modal": "On this page"};
    for (var id in names) {
      var d = byId(id);
      if (d && !d.hasAttribute("aria-label") && !d.hasAttribute("aria-labelledby")) d.setAttribute("aria-label", names[id]);
    }
  }

  // The search page: Sphinx writes "Search finished, found N pages ..." into a paragraph it
  // creates during the search, which a screen reader never hears. A status region, there from
  // the start, repeats it.
  function announceSearch() {
    var results = byId("search-results");
    if (!results || byId("preln-search-status")) return;
    var status = document.createElement("p");
    status.id = "preln-search-status";
    status.className = "visually-hidden";
    status.setAttribute("role", "status");
    results.parentNode.insertBefore(status, results);
    new MutationObserver(function () {
      var summary = results.querySelector(".search-summary");
      var text = summary ? summary.textContent.trim() : "";
      if (text && /finished|found|match/i.test(text) && status.textContent !== text) status.textContent = text;
    }).observe(results, {childList: true, subtree: true, characterData: true});
  }

  function watch(el, attrs, fn) {
    if (el) new MutationObserver(fn).observe(el, {attributes: true, attributeFilter: attrs});
  }

  document.addEventListener("DOMContentLoaded", function () {
    nameDialogs();
    announceSearch();
    nameThemeSwitch();
    watch(document.documentElement, ["data-mode"], nameThemeSwitch);
    forwardToggles();
    syncToggles();
    watch(byId("pst-primary-sidebar"), ["class"], syncToggles);
    watch(byId("pst-primary-sidebar-modal"), ["open"], syncToggles);
    watch(byId("pst-secondary-sidebar-modal"), ["open"], syncToggles);
    window.addEventListener("resize", syncToggles);
    // sphinx-togglebutton adds its buttons on DOMContentLoaded too, maybe after this listener
    setTimeout(nameToggleButtons, 0);
  });
  window.addEventListener("load", function () { nameToggleButtons(); hideIcons(); syncToggles(); });

  // 3. Formulas that speak: MathJax's semantic-enrich (loaded by _config.yml) computes a spoken
  //    form of each formula with the speech rule engine and makes it the formula's name
  //    (aria-label on mjx-container; a heading with a formula keeps it in its own name). Run
  //    during typesetting, that costs seconds on a chapter of 300 formulas, with the TeX source
  //    on screen all the while; so _config.yml turns enrichment off for the first typesetting,
  //    and here each formula is enriched afterwards, a few at a time between frames. (MathJax
  //    3.2.2: MathItem.enrich(document, force), attachSpeech(document), _state.)
  //    document.documentElement.dataset.prelnSpeech is "done" when every formula has its name.
  var ENRICHED = 30, SPEECH_BATCH = 12;
  function speakFormulas() {
    var mj = window.MathJax, doc = mj && mj.startup && mj.startup.document;
    var root = document.documentElement;
    if (!doc || !doc.math) { root.dataset.prelnSpeech = "none"; return; }
    // (a formula that scrolls may already carry markScrollables' placeholder name, "Formula")
    var items = Array.from(doc.math).filter(function (m) {
      var node = m.typesetRoot;
      return typeof m.enrich === "function" && node && (!node.hasAttribute("aria-label") || node.hasAttribute("data-preln-named"));
    });
    if (!items.length) { root.dataset.prelnSpeech = "done"; return; }
    var retries = mj._ && mj._.util && mj._.util.Retries;
    var saved = items.map(function (m) { return m.state(); });
    var next = 0;
    // (the state is set on the field: MathItem.state(n) below INSERTED would take the typeset
    // formula out of the page)
    function speak(i) {
      var m = items[i], node = m.typesetRoot;
      var placeholder = node.hasAttribute("data-preln-named") ? node.getAttribute("aria-label") : null;
      m._state = ENRICHED - 1;
      try { m.enrich(doc, true); m.attachSpeech(doc); } finally { m._state = saved[i]; }
      // A formula that starts with a space (\,D) has its speech one level down, where
      // attachSpeech does not look: the outermost speech of the enriched MathML is its name.
      var mml = m.inputData && m.inputData.enrichedMml;
      var label = node.getAttribute("aria-label");
      var found = (!label || label === placeholder) && mml && /data-semantic-speech="([^"]+)"/.exec(mml);
      if (found) {
        var tmp = document.createElement("textarea");
        tmp.innerHTML = found[1];                       // the attribute's entities, decoded
        node.setAttribute("aria-label", tmp.value);
        for (var c = node.firstElementChild; c; c = c.nextElementSibling) c.setAttribute("aria-hidden", "true");
      }
      // spoken: the name is MathJax's now, not markScrollables' (which would remove it)
      if (node.getAttribute("aria-label") !== placeholder) node.removeAttribute("data-preln-named");
    }
    function batch() {
      var end = Math.min(items.length, next + SPEECH_BATCH);
      for (; next < end; next++) speak(next);
      if (next < items.length) { setTimeout(batch, 0); return; }
      root.dataset.prelnSpeech = "done";
      markScrollables();
    }
    // The first formula loads the English rules (MathJax retries it until they are there).
    var first = function () { speak(0); };
    var ready = retries ? retries.handleRetriesFor(first) : Promise.resolve(first());
    ready.then(function () { next = 1; batch(); }, function (err) {
      root.dataset.prelnSpeech = "failed";
      console.warn("preln: formula speech unavailable:", err);
    });
  }

  var pending = null;
  function later() { clearTimeout(pending); pending = setTimeout(markScrollables, 200); }
  window.addEventListener("resize", later);
  document.addEventListener("DOMContentLoaded", markScrollables);
  window.addEventListener("load", function () {            // after images and fonts; MathJax
    markScrollables();                                      // (deferred) typesets after that
    var mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(function () {
      markScrollables();
      speakFormulas();
      // formulas typeset later (a widget's label) get their names the same way
      var typesetPromise = mj.typesetPromise;
      if (typesetPromise) mj.typesetPromise = function () {
        return typesetPromise.apply(mj, arguments).then(function (r) { speakFormulas(); return r; });
      };
    });
  });

  // 3b. A side road ("Deeper — skip on a first reading", <details class="preln-deeper">) opens
  //     when the address names a heading or anchor inside it (a link, the page's contents, a
  //     search result), so that the target is on screen rather than inside a closed box.
  function openDeeperTarget() {
    var id = location.hash.slice(1), target = null;
    try { target = id && document.getElementById(decodeURIComponent(id)); } catch (e) { return; }
    var opened = false;
    for (var d = target && target.closest("details.preln-deeper"); d; d = d.parentElement && d.parentElement.closest("details.preln-deeper")) {
      if (!d.open) { d.open = true; opened = true; }
    }
    if (opened) target.scrollIntoView();
  }
  document.addEventListener("DOMContentLoaded", openDeeperTarget);
  window.addEventListener("hashchange", openDeeperTarget);

  // 4. Printing (and `make pdf`): every dropdown (a solution, a toggled note) is printed open, and
  //    closed again afterwards: a closed <details> cannot be opened by a print stylesheet. Code
  //    cells a chapter hides (myst-nb's hide-input, details.hide) stay hidden. Nothing scrolls on
  //    paper, and MathJax 3 does not break lines: a display formula wider than the column is
  //    printed smaller, to fit.
  var undo = [];
  window.addEventListener("beforeprint", function () {
    var closed = document.querySelectorAll(".bd-article details:not([open]):not(.hide)");
    for (var i = 0; i < closed.length; i++) {
      (function (d) { d.open = true; undo.push(function () { d.open = false; }); })(closed[i]);
    }
    var formulas = document.querySelectorAll(".bd-article mjx-container[display='true']");
    for (var j = 0; j < formulas.length; j++) {
      var f = formulas[j], over = f.scrollWidth / Math.max(1, f.clientWidth);
      if (over > 1.01) {
        (function (f, size) {
          f.style.fontSize = size;
          undo.push(function () { f.style.fontSize = ""; });
        })(f, Math.max(50, Math.floor(100 / over)) + "%");
      }
    }
  });
  window.addEventListener("afterprint", function () {
    while (undo.length) undo.pop()();
  });
  // 5. A figure links to its full-size image (a phone zooms into it): in dark mode to the dark
  //    PNG the page shows, named by book/_ext/preln_site.py in data-preln-dark-href; in light mode
  //    and on paper to the light one. It follows the theme's switch (data-theme on <html>).
  function fullSizeLinks(print) {
    var dark = !print && document.documentElement.getAttribute("data-theme") === "dark";
    var links = document.querySelectorAll("a[data-preln-dark-href]");
    for (var i = 0; i < links.length; i++) {
      var a = links[i];
      // a link without an href (the PDF's builder takes the image links out) is left alone
      if (!a.hasAttribute("data-preln-light-href")) {
        if (!a.hasAttribute("href")) continue;
        a.setAttribute("data-preln-light-href", a.getAttribute("href"));
      }
      a.setAttribute("href", a.getAttribute(dark ? "data-preln-dark-href" : "data-preln-light-href"));
    }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { fullSizeLinks(false); });
  } else {
    fullSizeLinks(false);
  }
  new MutationObserver(function () { fullSizeLinks(false); })
    .observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
  window.addEventListener("beforeprint", function () { fullSizeLinks(true); });
  window.addEventListener("afterprint", function () { fullSizeLinks(false); });
})();
