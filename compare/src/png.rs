//! PNG versions of the report's figures: the very SVG the HTML report inlines, rasterised by
//! resvg with the system's fonts (Debian: fonts-dejavu-core).

use resvg::{tiny_skia, usvg};

use crate::svg::{FONT, HEIGHT, WIDTH};
use crate::CompareError;

/// Pixels per SVG unit: 1.5 gives 1140 × 660 images, sharp on a high-density screen.
pub const SCALE: f32 = 1.5;

pub(crate) struct Rasterizer {
    options: usvg::Options<'static>,
}

impl Rasterizer {
    /// Loads the system fonts once; without any font the text of the plots would be missing,
    /// so that is an error naming the package to install.
    pub fn new() -> Result<Rasterizer, CompareError> {
        let mut options = usvg::Options::default();
        let db = options.fontdb_mut();
        db.load_system_fonts();
        let family = FONT.split(',').map(str::trim).find(|f| {
            db.faces()
                .any(|face| face.families.iter().any(|(n, _)| n == f))
        });
        match family {
            Some(f) => {
                db.set_sans_serif_family(f);
                options.font_family = f.to_string();
            }
            None if !db.is_empty() => {
                // Some font exists: let fontdb fall back to it.
                let first = db.faces().next().and_then(|f| f.families.first()).map(|(n, _)| n.clone());
                if let Some(first) = first {
                    db.set_sans_serif_family(first.clone());
                    options.font_family = first;
                }
            }
            None => {
                return Err(CompareError::Png(
                    "no font found for the text of the plots: install one (Debian: apt-get install fonts-dejavu-core)".into(),
                ))
            }
        }
        Ok(Rasterizer { options })
    }

    pub fn render(&self, svg: &str) -> Result<Vec<u8>, CompareError> {
        let tree = usvg::Tree::from_str(svg, &self.options)
            .map_err(|e| CompareError::Png(format!("plot SVG: {e}")))?;
        let (w, h) = (
            (WIDTH as f32 * SCALE).round() as u32,
            (HEIGHT as f32 * SCALE).round() as u32,
        );
        let mut pixmap = tiny_skia::Pixmap::new(w, h)
            .ok_or_else(|| CompareError::Png("cannot allocate the image".into()))?;
        pixmap.fill(tiny_skia::Color::WHITE);
        resvg::render(
            &tree,
            tiny_skia::Transform::from_scale(SCALE, SCALE),
            &mut pixmap.as_mut(),
        );
        pixmap
            .encode_png()
            .map_err(|e| CompareError::Png(format!("PNG encoding: {e}")))
    }
}

/// Renders each figure into `(file name, PNG bytes)`, `name.png`; nothing is written.
pub(crate) fn render_all(
    figures: &[(String, String)],
) -> Result<Vec<(String, Vec<u8>)>, CompareError> {
    let r = Rasterizer::new()?;
    figures
        .iter()
        .map(|(name, svg)| Ok((format!("{name}.png"), r.render(svg)?)))
        .collect()
}
