// preln: two things the theme does not do for every page (book/_static/preln.css has the styles).
(function () {
  "use strict";

  // 1. A box that scrolls sideways (a wide table, output, code block or formula; at 320 CSS px
  //    there are many) must be reachable and scrollable by keyboard, and say what it is (WCAG
  //    2.1.1, 1.4.10; axe scrollable-region-focusable). pydata-sphinx-theme 0.17.1 gives
  //    tabindex=0 only to `pre`, `.cell_output > .output` and its own table wrappers, with no
  //    name; a chapter's HTML table scrolls in its own <div style="overflow-x:auto">
  //    (pydata/pydata-sphinx-theme#1100 is the theme's issue for code blocks). Here every box in
  //    the article whose content is wider than itself becomes a named region in the Tab order, and
  //    stops being one when the window is wide enough.
  var MARK = "data-preln-scroll";

  function describe(el) {
    var caption = el.querySelector("caption");
    if (caption && caption.textContent.trim()) return "Table: " + caption.textContent.trim().slice(0, 80);
    if (el.matches("mjx-container") || el.querySelector("mjx-container")) return "Formula";
    // Outputs first: myst-nb wraps a stream output in div.highlight-myst-ansi, which is not code.
    if (el.closest(".cell_output")) return el.querySelector("table") ? "Table output" : "Output";
    if (el.closest(".cell_input") || el.closest("div[class*='highlight-']")) return "Code";
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
        if (!el.hasAttribute("aria-label")) el.setAttribute("aria-label", describe(el) + " (scrolls sideways)");
      } else if (!scrolls && el.hasAttribute(MARK)) {
        el.removeAttribute(MARK);
        el.removeAttribute("tabindex");
        if (el.getAttribute("role") === "group") el.removeAttribute("role");
        el.removeAttribute("aria-label");
      }
    }
  }

  // Icon-font glyphs are decoration: their private-use characters must not enter names.
  function hideIcons() {
    var icons = document.querySelectorAll("i[class*='fa-']:not([aria-hidden]), span[class*='fa-']:not([aria-hidden])");
    for (var i = 0; i < icons.length; i++) icons[i].setAttribute("aria-hidden", "true");
  }
  document.addEventListener("DOMContentLoaded", hideIcons);

  var pending = null;
  function later() { clearTimeout(pending); pending = setTimeout(markScrollables, 200); }
  window.addEventListener("resize", later);
  document.addEventListener("DOMContentLoaded", markScrollables);
  window.addEventListener("load", function () {            // after images and fonts; MathJax
    markScrollables();                                      // (deferred) typesets after that
    var mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(markScrollables);
  });

  // 2. Printing (and `make pdf`): every dropdown (a solution, a toggled note) is printed open, and
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
})();
