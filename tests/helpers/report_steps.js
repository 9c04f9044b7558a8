// Injected into a copy of the report by test_report.py (see HEAD_JS there).
function shown(){return [...document.querySelectorAll('img,iframe')].map(e=>e.getAttribute('src')||'')
  .map(s=>(s.match(/filename=([^;]+);/)||[])[1]).filter(f=>f&&f!=='logo.svg')}
function act(t){
  if(t==='back'){const a=document.querySelector('nav ol a');  // the breadcrumb's home link
    if(a){a.click();return}}
  else if(t.startsWith('row:')){const want=t.slice(4).split('|');
    const tr=[...document.querySelectorAll('tr')].find(r=>want.every(w=>[...r.querySelectorAll('td')]
      .some(td=>td.textContent.trim()===w)));
    const a=tr&&tr.querySelector('a[iconname=eye]');if(a){a.click();return}}
  else{const el=[...document.querySelectorAll('nav a,nav span,nav li')].filter(e=>e.textContent.trim()===t).pop();
    if(el){el.click();return}}
  window.__errors.push('not found in the report: '+t)}
const steps=STEPS;
function run(i){if(i>=steps.length){document.body.setAttribute('data-errors',JSON.stringify(window.__errors));
  document.body.setAttribute('data-shown',JSON.stringify(window.__shown));return}
  act(steps[i]);setTimeout(()=>{if(steps[i].startsWith('row:'))window.__shown.push([steps[i],shown()]);run(i+1)},300)}
window.addEventListener('load',()=>setTimeout(()=>run(0),500));

