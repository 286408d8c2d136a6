// Glue between the Jupyter widget manager (embed-amd.js, @jupyter-widgets/html-manager 1.0) and
// this site. myst-nb loads it on pages with widget state, after require.js and before embed-amd.js
// (see nb_ipywidgets_js in _config.yml); it runs before MathJax, which is deferred.
(function () {
  // 1. embed-amd.js defines named AMD modules ("@jupyter-widgets/base", ".../html-manager/dist/...")
  //    and finds its Font Awesome files relative to each module's require.js URL, which by default
  //    is the *page's* folder. Point those names at our vendored copy, _static/jupyter-widgets/.
  var here = document.currentScript && document.currentScript.src;
  if (here && typeof require !== "undefined" && require.config) {
    var base = here.replace(/[^\/]*$/, "") + "jupyter-widgets";
    require.config({ paths: { "@jupyter-widgets/html-manager/dist": base, "@jupyter-widgets": base } });
  }

  // 2. The widgets typeset their labels with the MathJax 2 API, MathJax.Hub.Queue(["Typeset", Hub, el]),
  //    whenever window.MathJax exists; the site runs MathJax 3, which has no Hub (a TypeError on
  //    every widget). Provide Hub.Queue on top of MathJax 3's typesetPromise, queuing elements
  //    until MathJax has started.
  var pending = [];
  function flush() {
    var mj = window.MathJax;
    if (!pending.length || !mj || !mj.typesetPromise || !mj.startup || !mj.startup.promise) return;
    var els = pending.splice(0);
    mj.startup.promise = mj.startup.promise.then(function () { return mj.typesetPromise(els); })
      .catch(function (err) { console.warn("MathJax typeset of widget failed:", err); });
  }
  function installHub(mj) {
    if (mj.Hub) return;
    mj.Hub = {
      Queue: function () {
        for (var i = 0; i < arguments.length; i++) {
          var job = arguments[i];
          if (Array.isArray(job) && job[0] === "Typeset" && job[2]) pending.push(job[2]);
        }
        flush();
      }
    };
  }
  var cfg = (window.MathJax = window.MathJax || {});
  if (cfg.version) { installHub(cfg); return; }          // MathJax 3 already running
  installHub(cfg);                                        // the config object, until MathJax starts
  cfg.startup = cfg.startup || {};
  var ready = cfg.startup.ready;
  cfg.startup.ready = function () {
    if (ready) ready(); else window.MathJax.startup.defaultReady();
    installHub(window.MathJax);
    window.MathJax.startup.promise.then(flush);
  };
})();
