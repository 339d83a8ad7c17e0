import { IEditorLanguageRegistry } from '@jupyterlab/codemirror';
import { Language, LanguageSupport } from '@codemirror/language';
import { RangeSetBuilder } from '@codemirror/state';
import {
  Decoration,
  DecorationSet,
  EditorView,
  ViewPlugin,
  ViewUpdate
} from '@codemirror/view';
import { Input, Parser, PartialParse, TreeFragment } from '@lezer/common';

/**
 * A line IPython treats as a magic or shell escape rather than Python: `%%multihost`,
 * `%%local`, `%jaxsys start`, `!ls`. (`% 2` or `!=` continuing an expression are not.)
 */
export const MAGIC_LINE = /^[ \t]*(%%?[A-Za-z_]|![^=])/;

/** The [from, to) spans of the magic lines in `text`. */
export function magicSpans(text: string): [number, number][] {
  const spans: [number, number][] = [];
  let start = 0;
  while (start <= text.length) {
    let end = text.indexOf('\n', start);
    if (end < 0) {
      end = text.length;
    }
    if (MAGIC_LINE.test(text.slice(start, end))) {
      spans.push([start, end]);
    }
    start = end + 1;
  }
  return spans;
}

/** An input that reads magic lines as blanks of the same length. */
class MaskedInput implements Input {
  constructor(private _inner: Input) {
    this._spans = magicSpans(_inner.read(0, _inner.length));
  }

  get length(): number {
    return this._inner.length;
  }

  get lineChunks(): boolean {
    return this._inner.lineChunks;
  }

  chunk(from: number): string {
    return this._mask(from, this._inner.chunk(from));
  }

  read(from: number, to: number): string {
    return this._mask(from, this._inner.read(from, to));
  }

  private _mask(from: number, text: string): string {
    const to = from + text.length;
    for (const [a, b] of this._spans) {
      if (b <= from || a >= to) {
        continue;
      }
      const s = Math.max(a, from) - from;
      const e = Math.min(b, to) - from;
      text = text.slice(0, s) + ' '.repeat(e - s) + text.slice(e);
    }
    return text;
  }

  private _spans: [number, number][];
}

/** Python's parser, reading magic lines as blank lines. */
class MagicMaskingParser extends Parser {
  constructor(private _inner: Parser) {
    super();
  }

  createParse(
    input: Input,
    fragments: readonly TreeFragment[],
    ranges: readonly { from: number; to: number }[]
  ): PartialParse {
    return this._inner.createParse(new MaskedInput(input), fragments, ranges);
  }
}

const magicName = Decoration.mark({ class: 'cm-jaxsys-magic' });

function magicDecorations(view: EditorView): DecorationSet {
  const builder = new RangeSetBuilder<Decoration>();
  for (const { from, to } of view.visibleRanges) {
    let pos = from;
    while (pos <= to) {
      const line = view.state.doc.lineAt(pos);
      const m = MAGIC_LINE.exec(line.text);
      if (m) {
        // The magic's name: `%%multihost`, `%jaxsys`, `!ls`.
        const start = line.from + m.index + (m[0].length - m[1].length);
        const word = /^[%!]+[^\s]*/.exec(line.text.slice(start - line.from));
        if (word) {
          builder.add(start, start + word[0].length, magicName);
        }
      }
      pos = line.to + 1;
    }
  }
  return builder.finish();
}

const magicHighlighter = ViewPlugin.fromClass(
  class {
    decorations: DecorationSet;
    constructor(view: EditorView) {
      this.decorations = magicDecorations(view);
    }
    update(update: ViewUpdate): void {
      if (update.docChanged || update.viewportChanged) {
        this.decorations = magicDecorations(update.view);
      }
    }
  },
  { decorations: v => v.decorations }
);

/** Python with IPython's magic lines left out of the parse and marked instead. */
export function ipythonSupport(python: LanguageSupport): LanguageSupport {
  const base = python.language;
  const language = new Language(base.data, new MagicMaskingParser(base.parser), [], 'ipython');
  return new LanguageSupport(language, [python.support, magicHighlighter]);
}

/** The editor language of jaxsys notebooks, named by the kernel's `codemirror_mode`. */
export const LANGUAGE_NAME = 'jaxsys-ipython';
const LANGUAGE_MIME = 'text/x-jaxsys-ipython';

/**
 * Add the editor language of jaxsys notebooks: IPython whose `%%multihost` or `%%local`
 * cells are parsed as the Python they hold.
 *
 * JupyterLab parses IPython cells as plain Python, where a magic line is a syntax error
 * whose recovery can colour the lines after it wrongly. Only notebooks whose kernel names
 * this language get it; every other notebook keeps JupyterLab's `ipython`.
 */
export function registerJaxsysLanguage(languages: IEditorLanguageRegistry): void {
  languages.addLanguage({
    name: LANGUAGE_NAME,
    displayName: 'IPython (jaxsys)',
    mime: LANGUAGE_MIME,
    extensions: [],
    load: async () => {
      const python = await languages.getLanguage('python');
      if (!python?.support) {
        throw new Error('jaxsys: the python editor language is not available');
      }
      return ipythonSupport(python.support);
    }
  });
}
