-- The parent scope a reservation was also admitted on (a created bucket's: `bucket_root`), so that releasing
-- it gives the parent back its share even once the bucket is gone.
ALTER TABLE reservations ADD COLUMN parent TEXT;
