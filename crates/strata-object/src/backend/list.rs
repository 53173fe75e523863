//! Listings: pages, key ranges and grouped levels, read only as far as they need on backends that list in
//! key order; S3 through [`S3Wire`], local directories merging plain files and escaped keys.

use super::*;

impl Backend {
    /// A listing as every listing runs: one I/O event for it, the whole of it retried under the policy.
    pub(super) async fn listing<T, Fut>(
        &self,
        ctx: &IoContext,
        key: &str,
        list: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        self.observe(ctx, Op::List, key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, list)
                .await
        })
        .await
    }

    /// One page of at most `max_keys` objects under `prefix` (a key prefix, not necessarily ending in `/`),
    /// starting after `start_after`. Without a delimiter the listing is recursive. On backends that list in
    /// key order ([`Backend::lists_in_order`]) it reads only as far as the page needs (one or two backend
    /// pages), so paging through a large prefix costs one listing of it in all, not one per page; the others
    /// are read to the end, sorted, then paged.
    pub async fn list_page(
        &self,
        ctx: &IoContext,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        let what = format!("LIST {}/{prefix}", self.inner.id);
        let max_keys = max_keys.max(1);
        if let Some(w) = &self.inner.wire {
            return self
                .listing(ctx, prefix, || async {
                    // One more than the page shows whether another page follows.
                    let (objects, _, _) = wire_list(
                        w,
                        prefix,
                        None,
                        start_after,
                        |_| false,
                        max_keys.saturating_add(1),
                        &what,
                    )
                    .await?;
                    Ok(page_of(objects, max_keys))
                })
                .await;
        }
        if self.inner.local_root.is_some() {
            return self
                .observe(ctx, Op::List, prefix, |_| 0, async {
                    let objects = self
                        .local_list(prefix, start_after, max_keys.saturating_add(1), &what)
                        .await?;
                    Ok(page_of(objects, max_keys))
                })
                .await;
        }
        let (dir, name_prefix) = split_prefix(prefix)?;
        let ordered = self.lists_in_order();
        self.observe(ctx, Op::List, prefix, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || async {
                    let stream = match start_after.and_then(offset_path) {
                        Some(s) => self.inner.store.list_with_offset(dir.as_ref(), &s),
                        None => self.inner.store.list(dir.as_ref()),
                    };
                    let mut stream = stream.map_err(|e| classify(e, &what));
                    let mut objects = Vec::new();
                    while let Some(m) = stream.next().await {
                        let m = m?;
                        let key = m.location.as_ref();
                        if !key.starts_with(&*name_prefix) {
                            // Keys with a prefix are contiguous in key order: past them, none follow.
                            if ordered && key > &*name_prefix {
                                break;
                            }
                            continue;
                        }
                        if ordered && start_after.is_some_and(|s| key <= s) {
                            continue;
                        }
                        objects.push(listed_meta(self.inner.scheme, m));
                        // One more than the page shows whether another page follows.
                        if ordered && objects.len() > max_keys {
                            break;
                        }
                    }
                    // Backends list in arbitrary order (local directories do): sort, then page.
                    objects.sort_by(|a, b| a.key.cmp(&b.key));
                    if let Some(s) = start_after {
                        objects.retain(|o| o.key.as_str() > s);
                    }
                    Ok(page_of(objects, max_keys))
                })
                .await
        })
        .await
    }

    /// Every object whose key is greater than `start_after` and less than `end_before` (the end of the key
    /// space when `None`), in key order, recursively. On S3 this is one paged listing from `start_after`
    /// (`StartAfter`) that stops at `end_before`, so disjoint ranges can be listed in parallel with no more
    /// requests in all than one listing of everything.
    pub async fn list_range(
        &self,
        ctx: &IoContext,
        start_after: &str,
        end_before: Option<&str>,
    ) -> Result<Vec<ObjectMeta>> {
        Ok(self
            .list_span(ctx, start_after, end_before, usize::MAX)
            .await?
            .objects)
    }

    /// Like [`Backend::list_range`], but stops once `limit` objects are listed: `complete` says whether the
    /// listing reached `end_before`. Only backends that list in key order ([`Backend::lists_in_order`]) stop
    /// early; the others are read to the end and the first `limit` keys kept.
    pub async fn list_span(
        &self,
        ctx: &IoContext,
        start_after: &str,
        end_before: Option<&str>,
        limit: usize,
    ) -> Result<ListSpan> {
        let what = format!("LIST {} after {start_after:?}", self.inner.id);
        if start_after.contains('\0') || end_before.is_some_and(|e| e.contains('\0')) {
            return Err(Error::invalid_input("listing bounds contain a NUL byte"));
        }
        if let Some(w) = &self.inner.wire {
            return self
                .listing(ctx, start_after, || async {
                    let past_end = |m: &ObjectMeta| end_before.is_some_and(|e| m.key.as_str() >= e);
                    let (objects, _, complete) =
                        wire_list(w, "", None, Some(start_after), past_end, limit, &what).await?;
                    Ok(ListSpan { objects, complete })
                })
                .await;
        }
        if self.inner.local_root.is_some() {
            return self
                .observe(ctx, Op::List, start_after, |_| 0, async {
                    let mut objects = self
                        .local_list("", Some(start_after), limit.saturating_add(1), &what)
                        .await?;
                    objects.retain(|m| end_before.is_none_or(|e| m.key.as_str() < e));
                    let complete = objects.len() <= limit;
                    objects.truncate(limit);
                    Ok(ListSpan { objects, complete })
                })
                .await;
        }
        let ordered = self.lists_in_order();
        self.observe(ctx, Op::List, start_after, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || async {
                    let mut stream = match offset_path(start_after) {
                        Some(s) => self.inner.store.list_with_offset(None, &s),
                        None => self.inner.store.list(None),
                    }
                    .map_err(|e| classify(e, &what));
                    let mut objects = Vec::new();
                    let mut complete = true;
                    while let Some(m) = stream.next().await {
                        let m = listed_meta(self.inner.scheme, m?);
                        if m.key.as_str() <= start_after {
                            continue;
                        }
                        // Backends that do not list in key order (local directories) are read to the end.
                        if end_before.is_some_and(|e| m.key.as_str() >= e) {
                            if ordered {
                                break;
                            }
                            continue;
                        }
                        if ordered && objects.len() == limit {
                            complete = false;
                            break;
                        }
                        objects.push(m);
                    }
                    objects.sort_by(|a, b| a.key.cmp(&b.key));
                    if objects.len() > limit {
                        objects.truncate(limit);
                        complete = false;
                    }
                    Ok(ListSpan { objects, complete })
                })
                .await
        })
        .await
    }

    /// Whether listings of this backend come in key order, so that a listing of a key range can stop at its
    /// end (object stores and the in-memory store do; local directories do not).
    pub fn lists_in_order(&self) -> bool {
        matches!(self.inner.scheme, "s3" | "gs" | "az" | "memory")
    }

    /// Everything under `prefix` grouped by `delimiter` as S3 groups it: keys with no `delimiter` after the
    /// prefix are objects; the others roll up into common prefixes (the prefix, up to and including the
    /// first `delimiter` after it), in key order. S3 groups natively; other backends group a recursive
    /// listing of the prefix (`/` on a local directory reads only its level, [`Self::list_delimited`]).
    pub async fn list_grouped(
        &self,
        ctx: &IoContext,
        prefix: &str,
        delimiter: &str,
    ) -> Result<ListPage> {
        if delimiter.is_empty() {
            return Err(Error::invalid_input("an empty delimiter groups nothing"));
        }
        if delimiter == "/" && self.inner.wire.is_none() {
            return self.list_delimited(ctx, prefix).await;
        }
        if let Some(w) = &self.inner.wire {
            let what = format!("LIST {}/{prefix} (delimiter {delimiter:?})", self.inner.id);
            return self
                .listing(ctx, prefix, || async {
                    let (objects, common_prefixes, _) = wire_list(
                        w,
                        prefix,
                        Some(delimiter),
                        None,
                        |_| false,
                        usize::MAX,
                        &what,
                    )
                    .await?;
                    Ok(ListPage {
                        objects,
                        common_prefixes,
                        next_start_after: None,
                    })
                })
                .await;
        }
        let all = self.list_page(ctx, prefix, None, usize::MAX).await?;
        let mut objects = Vec::new();
        let mut common_prefixes: Vec<String> = Vec::new();
        for o in all.objects {
            match o.key[prefix.len()..].find(delimiter) {
                None => objects.push(o),
                Some(i) => {
                    let p = &o.key[..prefix.len() + i + delimiter.len()];
                    // Keys come in order, so a prefix's keys are contiguous.
                    if common_prefixes.last().map(String::as_str) != Some(p) {
                        common_prefixes.push(p.to_string());
                    }
                }
            }
        }
        Ok(ListPage {
            objects,
            common_prefixes,
            next_start_after: None,
        })
    }

    /// Everything directly under `prefix` with `/` as the delimiter: objects plus common prefixes.
    pub async fn list_delimited(&self, ctx: &IoContext, prefix: &str) -> Result<ListPage> {
        let what = format!("LIST {}/{prefix} (delimited)", self.inner.id);
        if let Some(w) = &self.inner.wire {
            return self
                .listing(ctx, prefix, || async {
                    let (objects, common_prefixes, _) =
                        wire_list(w, prefix, Some("/"), None, |_| false, usize::MAX, &what).await?;
                    Ok(ListPage {
                        objects,
                        common_prefixes,
                        next_start_after: None,
                    })
                })
                .await;
        }
        if self.inner.local_root.is_some() && !local_dir_walkable(prefix) {
            // No plain directory can hold this prefix: only escaped keys can be under it.
            return self
                .observe(ctx, Op::List, prefix, |_| 0, async {
                    let mut page = ListPage {
                        objects: Vec::new(),
                        common_prefixes: Vec::new(),
                        next_start_after: None,
                    };
                    for m in self.local_escaped(prefix, &what).await? {
                        match m.key[prefix.len()..].find('/') {
                            Some(i) => page
                                .common_prefixes
                                .push(m.key[..prefix.len() + i + 1].to_string()),
                            None => page.objects.push(m),
                        }
                    }
                    page.common_prefixes.dedup();
                    Ok(page)
                })
                .await;
        }
        let (dir, name_prefix) = split_prefix(prefix)?;
        self.observe(ctx, Op::List, prefix, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || async {
                    let r = self
                        .inner
                        .store
                        .list_with_delimiter(dir.as_ref())
                        .await
                        .map_err(|e| classify(e, &what))?;
                    let mut objects: Vec<ObjectMeta> = r
                        .objects
                        .into_iter()
                        .filter(|m| m.location.as_ref().starts_with(&*name_prefix))
                        .map(|m| {
                            let location = m.location.clone();
                            let mut meta = listed_meta(self.inner.scheme, m);
                            self.show_local_etag(&location, &mut meta);
                            meta
                        })
                        .collect();
                    let mut common_prefixes: Vec<String> = r
                        .common_prefixes
                        .into_iter()
                        .map(|p| format!("{p}/"))
                        .filter(|p| p.starts_with(&*name_prefix))
                        .filter(|p| p.as_str() != format!("{}/", crate::localkeys::ESCAPE_DIR))
                        .collect();
                    // A local directory's escaped keys, grouped as the level's plain entries are.
                    for m in self.local_escaped(&name_prefix, &what).await? {
                        match m.key[name_prefix.len()..].find('/') {
                            Some(i) => {
                                common_prefixes.push(m.key[..name_prefix.len() + i + 1].to_string())
                            }
                            None => objects.push(m),
                        }
                    }
                    objects.sort_by(|a, b| a.key.cmp(&b.key));
                    objects.dedup_by(|a, b| a.key == b.key);
                    common_prefixes.sort();
                    common_prefixes.dedup();
                    Ok(ListPage {
                        objects,
                        common_prefixes,
                        next_start_after: None,
                    })
                })
                .await
        })
        .await
    }
}

/// An object as an object store's listing reports it, with its ETag in the form a read of it reports: an HTTP
/// entity tag, quoted. Azure Blob lists `0x8D...` where its `ETag` header (a GET's or HEAD's) says
/// `"0x8D..."`, and fake-gcs-server lists GCS ETags bare too; quoted, the two compare equal, as they must
/// where a listing confirms what a read returned (the cache's metadata refresh) or a read is pinned to a
/// listed ETag.
fn listed_meta(scheme: &str, m: object_store::ObjectMeta) -> ObjectMeta {
    let mut meta = convert_meta(m);
    if matches!(scheme, "az" | "gs")
        && let Some(e) = &mut meta.etag
        && !e.starts_with('"')
        && !e.starts_with("W/")
    {
        *e = format!("\"{e}\"");
    }
    meta
}

/// The first `max_keys` of `objects` (in key order) as a page; `next_start_after` when more follow.
pub(super) fn page_of(mut objects: Vec<ObjectMeta>, max_keys: usize) -> ListPage {
    let next = if objects.len() > max_keys {
        objects.truncate(max_keys);
        objects.last().map(|o| o.key.clone())
    } else {
        None
    };
    ListPage {
        objects,
        common_prefixes: Vec::new(),
        next_start_after: next,
    }
}

/// A listing offset as the backend compares it: the key itself, never percent-encoded (`Path::from` encodes
/// `#`, `%`, `~`, control characters and the like, which moved the offset past keys that sort between the key and
/// its encoding: paging lost them). `None` (list from the start; the caller filters) for a string that is
/// not a valid path.
pub(super) fn offset_path(s: &str) -> Option<Path> {
    if s.is_empty() {
        return None;
    }
    Path::parse(s).ok().filter(|p| p.as_ref() == s)
}

/// Split a listing prefix into the directory to list and the name prefix to filter by.
pub(super) fn split_prefix(prefix: &str) -> Result<(Option<Path>, String)> {
    if prefix.is_empty() {
        return Ok((None, String::new()));
    }
    if prefix.contains('\0') || prefix.split('/').any(|s| s == "..") || prefix.starts_with('/') {
        return Err(Error::invalid_input(format!(
            "invalid listing prefix {prefix:?}"
        )));
    }
    let dir = match prefix.rfind('/') {
        Some(i) if i > 0 => Some(to_path(&prefix[..i])?),
        _ => None,
    };
    Ok((dir, prefix.to_string()))
}
